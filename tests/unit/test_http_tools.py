"""`toolledger.http` on its own: what the declarations see, and how each way a request ends is
classified, against the fake payments API on a loopback port (no ledger).

The scenarios with a ledger (memory and Kafka + PostgreSQL, reconciler and replay) are in
tests/contract/test_http_tools.py. Here the tools are called directly with
`fake_tool_context()`, so what is checked is the error raised and whether the context says the
request left, which is what the executor classifies by.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import cast

import httpx
import pytest

import toolledger.http
from tests.http_tools import look_up_charge, refund, refund_undeclared
from tests.integration.procs import until
from toolledger import SideEffect, ToolContext, ToolExecutionRecord, Toolset, external
from toolledger.api.compensation import compensation_tool
from toolledger.events.records import CallRecord
from toolledger.http import (
    RequestFailed,
    RequestInProgress,
    RequestNotSent,
    RequestOutcomeUnknown,
    RequestRefused,
    ToolHTTP,
    outcome_of,
)
from toolledger.http.fake import FakePayments
from toolledger.runtime.resend import RefusedBeforeLookup
from toolledger.testing import assert_tool_contract, fake_tool_context

HOUR = timedelta(hours=1)
ARGS = {"charge": "ch_1", "amount": 2500}


@pytest.fixture
async def api() -> AsyncIterator[FakePayments]:
    async with FakePayments() as fake:
        yield fake


def test_the_export_list_is_frozen() -> None:
    """toolledger.http is a documented module: its names change only by decision."""
    assert sorted(toolledger.http.__all__) == [
        "BODY_LIMIT",
        "DEFAULT_KEY_HEADER",
        "DEFAULT_REPLAYED_HEADER",
        "DEFAULT_STATUSES",
        "Outcome",
        "RequestFailed",
        "RequestInProgress",
        "RequestLabel",
        "RequestNotSent",
        "RequestOutcomeUnknown",
        "RequestRefused",
        "ToolHTTP",
        "outcome_of",
        "sends_with_key",
    ]


def test_a_tool_sending_through_toolhttp_passes_its_key_and_marks_sending() -> None:
    """A tool that hands its context to ToolHTTP never writes `context.idempotency_key` or
    `context.sending()`; the contract check and the executor must still see both, or every
    refused connection would be recorded "may have happened"."""
    for tool in (refund, refund_undeclared, look_up_charge):
        assert_tool_contract(tool)
        assert tool.marks_sending, tool.name
    assert refund.resends and not refund_undeclared.resends


def test_replays_key_for_is_refused_where_a_resend_would_not_be_a_lookup() -> None:
    """A resend is harmless only to a downstream that sees the same key, only for external()
    tools, never for an approval-gated one, and never beside a hook of its own."""
    with pytest.raises(ValueError, match="approval-gated"):
        external(approval=True, replays_key_for=HOUR)
    with pytest.raises(ValueError, match="positive"):
        external(replays_key_for=timedelta(0))
    with pytest.raises(ValueError, match="only external"):
        SideEffect("write", replays_key_for=HOUR)
    box = Toolset("box")
    with pytest.raises(ValueError, match=r"never reads context\.idempotency_key"):

        @box.tool(external(replays_key_for=HOUR))
        async def keyless(amount: int, context: ToolContext) -> int:
            async with context.sending():
                return amount

    async def lookup(record: object, context: ToolContext) -> object:
        return None

    with pytest.raises(ValueError, match="both replays_key_for and a reconcile hook"):

        @box.tool(external(replays_key_for=HOUR), reconcile=lookup)  # type: ignore[arg-type]
        async def hooked(amount: int, context: ToolContext) -> int:
            return len(context.idempotency_key) + amount


def test_the_outcome_table_and_its_overrides() -> None:
    """Each status class lands in its row, and a tool's own table wins."""
    defaults = toolledger.http.DEFAULT_STATUSES
    assert [outcome_of(s, defaults) for s in (200, 201, 400, 404, 409, 429, 500, 503, 302)] == [
        "result",
        "result",
        "failed",
        "failed",
        "failed",
        "refused",
        "indeterminate",
        "indeterminate",
        "indeterminate",
    ]
    assert outcome_of(409, {**defaults, 409: "in_progress"}) == "in_progress"
    assert issubclass(RequestRefused, RefusedBeforeLookup) and issubclass(RequestFailed, Exception)


async def test_the_key_goes_in_the_header_and_the_boundary_is_the_first_byte(
    api: FakePayments,
) -> None:
    """The request must carry the call's key, and the context must say "sent" once it left."""
    async with ToolHTTP(base_url=api.url) as client:
        context = fake_tool_context()
        assert not context.sent
        answer = await client.post("/v1/refunds", json=ARGS, context=context)
        assert answer.status_code == 200 and context.sent
        assert api.requests[0].key == "test-run:test-call"
        assert context.evidence == [f"POST {api.url}/v1/refunds -> 200"]
        again = fake_tool_context()
        await client.post("/v1/refunds", json=ARGS, context=again)
        assert again.evidence[0].endswith("(Idempotent-Replayed: true)")


async def test_a_custom_header_name_and_a_users_own_client(api: FakePayments) -> None:
    """The header name is configurable, and wrapping the user's client must leave it open."""
    async with httpx.AsyncClient(base_url=api.url) as own:
        client = ToolHTTP(own, key_header="X-Request-Key")
        context = fake_tool_context(idempotency_key="k-1")
        answer = await client.get("/v1/charges/ch_1", context=context)
        assert answer.request.headers["X-Request-Key"] == "k-1"
        await client.aclose()
        assert not own.is_closed
    with pytest.raises(ValueError, match="another key"):
        await ToolHTTP(base_url=api.url).post(
            "/v1/refunds", json=ARGS, headers={"Idempotency-Key": "other"}, context=context
        )


async def test_refused_dns_and_tls_failures_are_not_sent(api: FakePayments) -> None:
    """Nothing reached a server in any of these: the context must not say "sent", or a write
    would be parked as unknown instead of being safe to run again."""
    tls = ToolHTTP(base_url=api.url.replace("http:", "https:"), timeout=0.5)
    dns = ToolHTTP(base_url="http://payments.invalid", timeout=2)
    refused = ToolHTTP(base_url=api.url)
    for client in (tls, dns):  # TLS: a plain HTTP server cannot answer the handshake
        context = fake_tool_context()
        with pytest.raises(RequestNotSent, match="was not sent"):
            await client.post("/v1/refunds", json=ARGS, context=context)
        assert not context.sent
    await api.refuse()
    context = fake_tool_context()
    with pytest.raises(RequestNotSent, match="ConnectError"):
        await refused.post("/v1/refunds", json=ARGS, context=context)
    assert not context.sent and api.refunds == {} and api.posts() == []
    for client in (tls, dns, refused):
        await client.aclose()


async def test_a_pool_timeout_is_not_sent(api: FakePayments) -> None:
    """Waiting for a pooled connection sends nothing: not attempted, whatever the wait."""
    limits = httpx.Limits(max_connections=1)
    timeout = httpx.Timeout(5.0, pool=0.05)
    async with httpx.AsyncClient(base_url=api.url, limits=limits, timeout=timeout) as own:
        client = ToolHTTP(own)
        api.script.append("hold")
        holder = asyncio.create_task(
            client.post("/v1/refunds", json=ARGS, context=fake_tool_context(tool_call_id="a"))
        )
        await until(lambda: api.requests, timeout=5, what="the held request to arrive")
        context = fake_tool_context(tool_call_id="b")
        with pytest.raises(RequestNotSent, match="PoolTimeout"):
            await client.post("/v1/refunds", json=ARGS, context=context)
        assert not context.sent
        api.release()
        assert (await holder).status_code == 200


async def test_a_read_timeout_and_a_reset_are_unknown(api: FakePayments) -> None:
    """Once the request left, no answer means "it may have happened": the context must say
    sent, and the error must say the server may have acted."""
    async with ToolHTTP(base_url=api.url, timeout=httpx.Timeout(5.0, read=0.2)) as client:
        api.script.append("hold")
        context = fake_tool_context()
        with pytest.raises(RequestOutcomeUnknown, match="ReadTimeout"):
            await client.post("/v1/refunds", json=ARGS, context=context)
        assert context.sent
        api.release()
        api.script.append("drop")
        context = fake_tool_context(tool_call_id="other")
        with pytest.raises(RequestOutcomeUnknown, match="may have acted"):
            await client.post("/v1/refunds", json=ARGS, context=context)
        assert context.sent


async def test_4xx_refused_5xx_and_in_progress_answers(api: FakePayments) -> None:
    """Each answer raises its row's error, with the status and a bounded body."""
    async with ToolHTTP(base_url=api.url, statuses={409: "in_progress"}) as client:
        with pytest.raises(RequestFailed) as failed:
            await client.post(
                "/v1/refunds", json={**ARGS, "amount": 10**6}, context=fake_tool_context()
            )
        assert failed.value.status == 400 and "exceeds" in failed.value.body
        assert not isinstance(failed.value, RequestRefused)
        api.script.append("503")
        with pytest.raises(RequestOutcomeUnknown, match="answered 503") as unknown:
            await client.get("/v1/charges/ch_1", context=fake_tool_context())
        assert unknown.value.status == 503
        api.script.append("in_progress")
        with pytest.raises(RequestInProgress, match="still in progress"):
            await client.post("/v1/refunds", json=ARGS, context=fake_tool_context(tool_call_id="p"))
    with pytest.raises(RequestRefused):
        async with ToolHTTP(base_url=api.url, statuses={404: "refused"}) as client:
            await client.get("/v1/charges/nope", context=fake_tool_context())


async def test_a_transport_that_reports_no_stages_counts_as_sent() -> None:
    """A custom transport gives no sending mark: an error it raises must count as sent unless
    its type can only come before sending, or a lost refund would be rerun."""

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset by peer", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    for handler, error, sent in (
        (reset, RequestOutcomeUnknown, True),
        (refused, RequestNotSent, False),
    ):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as own:
            context = fake_tool_context()
            with pytest.raises(error):
                await ToolHTTP(own).post("http://x/v1/refunds", json=ARGS, context=context)
            assert context.sent is sent


def test_the_compensation_of_a_resending_tool_is_never_resent() -> None:
    """A compensation call inherits its tool's effect; inheriting `replays_key_for` refused to
    build it (its hook does not send the key) and would have resent an undo."""
    box = Toolset("undo")

    async def undo(record: ToolExecutionRecord, context: ToolContext) -> None:
        return None

    @box.tool(external(replays_key_for=HOUR), compensation=undo)
    async def pay(amount: int, context: ToolContext) -> int:
        return amount + len(context.idempotency_key)

    compensating = compensation_tool(pay, cast(CallRecord, None))  # only its hook reads it
    assert pay.resends and not compensating.resends


async def test_a_tool_timeout_while_waiting_for_the_pool_is_not_sent(api: FakePayments) -> None:
    """The tool's own timeout can fire while its request waits for a pooled connection, before
    any stage is reported: on the helper's own client that is "nothing left", not unknown."""
    async with ToolHTTP(base_url=api.url, limits=httpx.Limits(max_connections=1)) as client:
        api.script.append("hold")
        holder = asyncio.create_task(
            client.post("/v1/refunds", json=ARGS, context=fake_tool_context(tool_call_id="a"))
        )
        await until(lambda: api.requests, timeout=5, what="the held request to arrive")
        context = fake_tool_context(tool_call_id="b")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await client.post("/v1/refunds", json=ARGS, context=context)
        assert not context.sent
        api.release()
        assert (await holder).status_code == 200
