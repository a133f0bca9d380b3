"""The MCP server over the ledger, through a real in-process `mcp.Client`, on both ledgers.

Each scenario runs on the memory ledger and on Kafka + PostgreSQL (one suite, two subclasses,
the base deleted so it is not collected). The fake billing system judges "one effect"; the
operator decides through the real HTTP API on the same stack.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import mcp.types as types
import pytest
from mcp import Client, MCPError

from tests import api_support as s
from tests.integrations import mcp_tools
from tests.integrations.mcp_support import (
    BALANCE,
    ISSUE,
    ISSUE_LARGE,
    ISSUE_SLOWLY,
    ISSUE_TIMING_OUT,
    REFUND,
    TENANT,
    Harness,
    harness,
    stack_settings,
    status,
    text,
)
from tests.isolated import Isolated
from toolledger import Ledger
from toolledger.integrations._common import decode_run_id
from toolledger.integrations.mcp import LedgerMCPServer, call_tool_keyed
from toolledger.wiring.stack import LedgerStack


class McpScenarios:
    """Every scenario, against whatever ledger the subclass's `h` fixture provides."""

    async def test_a_client_retrying_with_the_same_key_gets_the_recorded_result(
        self, h: Harness
    ) -> None:
        """A client that resends a refund after a lost answer must get the first refund back,
        not make a second one."""
        first = await h.call(ISSUE, "c1")
        again = await h.call(ISSUE, "c1")
        assert status(first) == status(again) == "completed"
        assert text(again) == text(first)
        assert again.structured_content == first.structured_content
        assert h.billing.requests("r1:c1") == 1
        assert h.billing.effects() == 1

    async def test_a_client_that_gave_up_waiting_and_resends_gets_the_one_refund(
        self, h: Harness
    ) -> None:
        """A client whose read timeout fires mid-call (the SDK cancels the call on the server)
        must get one refund when it resends the key: the one already sent, found by the tool's
        reconcile hook, or, if the timeout came before anything was sent, the one made then."""
        async with Client(h.server.server) as client:
            with pytest.raises(MCPError, match="Timed out"):
                await call_tool_keyed(
                    client, ISSUE_SLOWLY, REFUND, run_id="r1", tool_call_id="c1",
                    read_timeout_seconds=0.1,
                )  # fmt: skip
        resent = await h.call(ISSUE_SLOWLY, "c1")
        assert status(resent) == "completed", text(resent)
        credit = await h.billing.find_credit("r1:c1")
        assert credit is not None and resent.structured_content == credit.model_dump()
        assert h.billing.requests() == 1

    async def test_two_servers_given_one_key_at_once_make_one_refund(self, h: Harness) -> None:
        """Two servers (replicas behind one endpoint) receiving the same key concurrently must
        make one refund and both answer it."""
        twin = LedgerMCPServer(
            Ledger.from_stack(h.ledger.stack), mcp_tools.refunds, tenant_id=TENANT
        )

        async def through(server: LedgerMCPServer) -> str:
            async with Client(server.server) as client:
                result = await call_tool_keyed(
                    client, ISSUE_SLOWLY, REFUND, run_id="r1", tool_call_id="c1"
                )
            assert status(result) == "completed", text(result)
            return text(result)

        answers = await asyncio.gather(through(h.server), through(twin))
        assert answers[0] == answers[1]
        assert h.billing.effects() == 1
        assert h.billing.requests() == 1

    async def test_an_unknown_refund_says_so_and_the_operator_s_truth_comes_back(
        self, h: Harness
    ) -> None:
        """A timed-out refund must reach the model as unknown (with its key, "do not retry" and
        how it is settled), never as an error to try again; once an operator resolves it over
        the API, the same key returns the operator's result without running again."""
        unknown = await h.call(ISSUE_TIMING_OUT, "c1")
        said = text(unknown)
        assert unknown.is_error and status(unknown) == "indeterminate"
        assert "unknown" in said and "r1:c1" in said
        assert "Do not call it again" in said and "toolledger executions resolve r1:c1" in said
        assert "/v1/tool-executions/r1:c1/resolve" in said
        assert "try again" not in said.lower()
        assert status(await h.call(ISSUE_TIMING_OUT, "c1")) == "indeterminate"
        value = {"credit_id": "cr_ops", "account_id": "acct-7", "amount_cents": 2500}
        await h.decide("r1:c1", "resolve", outcome="completed", value=value)
        truth = await h.call(ISSUE_TIMING_OUT, "c1")
        assert status(truth) == "completed"
        assert truth.structured_content == value
        assert h.billing.requests() == 1

    async def test_the_model_repeating_a_timed_out_refund_under_a_new_call_id_is_held(
        self, h: Harness
    ) -> None:
        """The model that repeats a timed-out refund as a new tool call must not refund twice:
        the repeat is held while the first is unknown, and hears the first's result after."""
        await h.call(ISSUE_TIMING_OUT, "c1")
        repeat = await h.call(ISSUE_TIMING_OUT, "c2")
        assert status(repeat) == "held", text(repeat)
        assert "r1:c1" in text(repeat) and "NOT run" in text(repeat)
        assert (repeat.meta or {})["dev.toolledger/waiting-on"] == "r1:c1"
        value = {"credit_id": "cr_ops", "account_id": "acct-7", "amount_cents": 2500}
        await h.decide("r1:c1", "resolve", outcome="completed", value=value)
        after = await h.call(ISSUE_TIMING_OUT, "c2")
        assert status(after) == "completed"
        assert "cr_ops" in text(after)
        assert h.billing.requests() == 1
        assert await h.ledger.read_call("r1:c2") is None

    async def test_an_approved_refund_runs_once_when_asked_again_with_its_key(
        self, h: Harness
    ) -> None:
        """A refund needing approval must not run before the operator approves, then run once
        for the same key, however often it is asked."""
        waiting = await h.call(ISSUE_LARGE, "c1")
        assert status(waiting) == "awaiting_approval"
        assert "NOT run" in text(waiting) and "approve r1:c1" in text(waiting)
        assert status(await h.call(ISSUE_LARGE, "c1")) == "awaiting_approval"
        assert h.billing.requests() == 0
        await h.decide("r1:c1", "approve")
        ran = await h.call(ISSUE_LARGE, "c1")
        again = await h.call(ISSUE_LARGE, "c1")
        assert status(ran) == status(again) == "completed"
        assert text(ran) == text(again)
        assert h.billing.requests() == 1

    async def test_a_rejected_refund_stays_rejected_under_its_key(self, h: Harness) -> None:
        """A rejected approval must not be asked again by calling with the same key: the model
        hears the rejection and nothing runs."""
        await h.call(ISSUE_LARGE, "c1")
        await h.decide("r1:c1", "reject")
        for _ in range(2):
            rejected = await h.call(ISSUE_LARGE, "c1")
            assert status(rejected) == "failed"
            assert "rejected" in text(rejected)
        assert h.billing.requests() == 0

    async def test_failures_say_whether_calling_again_can_help(self, h: Harness) -> None:
        """A definite refusal must say it did not take effect and not to repeat it unchanged;
        a refusal before sending must say it may be called again."""
        closed = await h.call("shop__refunds__issue_to_closed", "c1")
        assert status(closed) == "failed"
        assert "did not take effect" in text(closed) and "closed" in text(closed)
        assert "unless the cause has been fixed" in text(closed)
        no_token = await h.call("shop__refunds__issue_without_token", "c2")
        assert status(no_token) == "failed"
        assert "may be called again" in text(no_token)

    async def test_dotted_tool_names_round_trip_through_safe_names(self, h: Harness) -> None:
        """Tools named with dots must be listed under names model APIs accept and map back to
        the declared tool in the ledger."""
        async with Client(h.server.server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
        assert ISSUE in listed and "shop.refunds.issue" not in listed
        assert all(name.replace("_", "").replace("-", "").isalnum() for name in listed)
        assert listed[ISSUE].title == "shop.refunds.issue"
        assert listed[ISSUE].input_schema["required"] == ["account_id", "amount_cents"]
        hints = listed[BALANCE].annotations
        assert hints is not None and hints.read_only_hint is True
        await h.call(ISSUE, "c1")
        record = await h.ledger.read_call("r1:c1")
        assert record is not None and record.tool == "shop.refunds.issue"

    async def test_the_server_tells_the_model_up_front_not_to_repeat_unsettled_calls(
        self, h: Harness
    ) -> None:
        """Before any call, the client (and through it the model) must hear that a resend with
        the same key is safe and a repeat of an unknown or held call under a new one is not."""
        async with Client(h.server.server) as client:
            said = client.instructions
        assert said is not None
        assert "same key is always safe" in said and "do not make the same request again" in said

    async def test_a_colon_in_a_run_id_is_encoded_by_the_helper_and_refused_raw(
        self, h: Harness
    ) -> None:
        """A run id `user:42` must never be split into run `user` and call `42:c1`: the client
        helper encodes it, and a raw one in `_meta` is refused before anything runs."""
        await h.call(ISSUE, "c1", run="user:42")
        record = await h.ledger.read_call("user%3A42:c1")
        assert record is not None and decode_run_id(record.run_id) == "user:42"
        raw_run = _meta({"dev.toolledger/run-id": "user:42", "dev.toolledger/tool-call-id": "c2"})
        ambiguous = _meta({"dev.toolledger/key": "user:42:c3"})
        async with Client(h.server.server) as client:
            with pytest.raises(MCPError, match="contains ':'"):
                await client.call_tool(ISSUE, REFUND, meta=raw_run)
            with pytest.raises(MCPError, match="more than one ':'"):
                await client.call_tool(ISSUE, REFUND, meta=ambiguous)
            whole = await client.call_tool(
                ISSUE, REFUND, meta=_meta({"dev.toolledger/key": "r9:c4"})
            )
        assert status(whole) == "completed"
        assert h.billing.effects() == 2

    async def test_without_a_key_a_refund_is_refused_and_a_read_runs(self, h: Harness) -> None:
        """A refund sent with no key must be refused before anything is reserved (a resend
        would be a second refund); a read may run under a key the server makes up."""
        async with Client(h.server.server) as client:
            refused = await client.call_tool(ISSUE, REFUND)
            looked = await client.call_tool(BALANCE, {"account_id": "acct-7"})
        assert status(refused) == "refused"
        assert "dev.toolledger/run-id" in text(refused) and "Nothing was reserved" in text(refused)
        assert h.billing.requests() == 0
        assert status(looked) == "completed"
        assert str((looked.meta or {})["dev.toolledger/key"]).startswith("mcp-unkeyed-")

    async def test_other_arguments_under_a_used_key_are_refused(self, h: Harness) -> None:
        """The same key with other arguments must be refused, not run as a second refund."""
        await h.call(ISSUE, "c1")
        other = await h.call(ISSUE, "c1", {"account_id": "acct-7", "amount_cents": 9900})
        assert status(other) == "failed" and "other arguments" in text(other)
        assert h.billing.requests() == 1


def _meta(entries: dict[str, str]) -> types.RequestParamsMeta:
    """Raw `_meta` entries, as a client that does not use `call_tool_keyed` sends them."""
    return cast(types.RequestParamsMeta, entries)


class TestOnMemory(McpScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[Harness]:
        stack = await LedgerStack.memory(verify_keys=s.KEYS)
        async with harness(stack, s.api_settings(), tmp_path / "billing.db") as h:
            yield h


class TestOnKafkaPostgres(McpScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
        settings = stack_settings(isolated)
        stack = await LedgerStack.connect(settings, run_projector=True)
        async with harness(stack, settings, tmp_path / "billing.db") as h:
            yield h


del McpScenarios
