"""HTTP tools against a real local server, on the memory ledger and on Kafka + PostgreSQL.

`HttpToolScenarios` is written once and run by `TestMemoryHttpTools` (`Ledger.memory()`) and
`TestKafkaPostgresHttpTools` (this test's topics and schema, an in-process projector). The tools
(`tests.http_tools`) are written with `toolledger.http`; the server is the Stripe-like fake of
the package (`toolledger.http.fake`), listening on a loopback port and reached through
httpx's real transport, so "did the request leave" is decided on a real socket. The fake is
the judge of "one effect": it counts every request and every refund it made.

The reconciler here is the `Reconciler` class itself, in process, on the test's stack and clock
(its faust shell is covered by tests/integration/test_reconciler.py); the clock is moved, never
slept on, to put a call past its deadline or its replay window.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests import http_tools
from tests.contract.runtime_harness import Harness, kafka_postgres_harness, memory_harness
from tests.http_tools import REPLAY_WINDOW, look_up_charge, refund, refund_undeclared
from tests.integration.procs import until
from tests.isolated import Isolated
from toolledger import Tool, ToolCallFailed, ToolCallIndeterminate
from toolledger.events.models import CallCompleted, Event
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, Verdict
from toolledger.http.fake import FakePayments
from toolledger.processors.reconciler import Reconciler
from toolledger.processors.schedule import ReconcilePolicy, is_due
from toolledger.runtime.resend import ResendWindowPassed
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

REFUND = {"charge": "ch_1", "amount": 2500, "memo": ""}
UNDECLARED = {"charge": "ch_1", "amount": 2500}
KEY = "r1:c1"
#: Arguments over 2 KB travel by reference, so a memo can put a call's arguments in a blob.
LIMITS = PayloadLimits(inline_bytes=2048, max_bytes=3 * 1024 * 1024)


class CompletionHeld(StackPort):
    """A port that holds every `CallCompleted` until `release` is set: a resend's attempt is
    in the ledger, and the completion it heard is still on its way to the projector."""

    def __init__(self, stack: LedgerStack) -> None:
        super().__init__(stack)
        self.release = asyncio.Event()

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        if isinstance(event, CallCompleted):
            await self.release.wait()
        return await super().append_and_await(event, timeout)


class HttpToolScenarios:
    """Every scenario, against whatever ledger the subclass's `h` fixture provides."""

    @pytest.fixture
    async def api(self) -> AsyncIterator[FakePayments]:
        async with http_tools.fake_payments() as fake:
            yield fake

    async def call(self, h: Harness, tool: Tool[Any, Any], arguments: dict[str, Any]) -> Any:
        return await h.call(tool, "c1", arguments=arguments)

    async def reconcile(self, h: Harness, tool: Tool[Any, Any]) -> tuple[int, CallRecord]:
        """One scan of the reconciler over the key's record; how many questions it started,
        and the record once they finished."""
        reconciler = Reconciler(
            {tool.name: tool}, StackPort(h.stack), clock=h.clock, read_call=h.stack.store.get_call
        )
        started = reconciler.scan([await h.record(KEY)])
        await until(lambda: reconciler.busy == 0, timeout=15, what="the reconciler's questions")
        return started, await h.record(KEY)

    async def attempts(self, h: Harness) -> list[dict[str, Any]]:
        """The key's accepted reconcile attempts, as logged."""
        return [
            json.loads(e.event_json)
            for e in await h.stack.store.history(KEY)
            if e.event_type == "reconcile_attempted" and e.accepted
        ]

    async def test_connection_refused_is_not_attempted_and_a_rerun_refunds_once(
        self, h: Harness, api: FakePayments
    ) -> None:
        """A refused connection must not be recorded as "may have happened": that would park a
        refund nothing ever received. It is failed, not attempted, and the rerun refunds once."""
        await api.refuse()
        outcome = await self.call(h, refund, REFUND)
        assert (outcome.status, outcome.not_attempted) == ("failed", True)
        assert "was not sent" in (outcome.error or "") and KEY in (outcome.error or "")
        assert api.requests == [] and api.refunds == {}
        await api.accept()
        again = await self.call(h, refund, REFUND)
        assert again.status == "completed" and not again.replayed
        assert len(api.refunds) == 1 and len(api.posts()) == 1

    async def test_applied_then_reset_is_settled_by_a_resend_on_replay(
        self, h: Harness, api: FakePayments
    ) -> None:
        """The refund is made and the connection dies before the answer: the call must be
        unknown (not failed, or a rerun would refund twice), and replaying the key must resend
        it with the same key, so the model hears the fake's first answer and one refund exists."""
        api.script.append("drop")
        with pytest.raises(ToolCallIndeterminate, match="was sent and then"):
            await self.call(h, refund, REFUND)
        assert len(api.refunds) == 1
        first = next(iter(api.refunds.values()))
        replayed = await h.new_ledger().call(
            refund, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=REFUND
        )
        assert replayed.status == "completed" and replayed.replayed
        assert replayed.value is not None and replayed.value.id == first["id"]
        assert len(api.refunds) == 1
        assert [p.key for p in api.posts()] == [KEY, KEY]
        record = await h.record(KEY, "completed")
        assert record.settled_by == "reconcile"
        (attempt,) = await self.attempts(h)
        assert "Idempotent-Replayed: true" in attempt["detail"] and KEY in attempt["detail"]

    async def test_applied_then_reset_is_settled_by_the_reconcilers_resend(
        self, h: Harness, api: FakePayments
    ) -> None:
        """The reconciler, not only a replay, must settle the unknown refund by resending it
        within the window, ledgering the resend as an attempt with what came back."""
        api.script.append("drop")
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund, REFUND)
        started, record = await self.reconcile(h, refund)
        assert started == 1 and record.status == "completed"
        assert record.settled_by == "reconcile" and record.reconcile_attempts == 1
        assert len(api.refunds) == 1 and len(api.posts()) == 2
        outcome = await self.call(h, refund, REFUND)
        assert outcome.replayed and outcome.value is not None
        assert outcome.value.id == next(iter(api.refunds))
        assert len(api.posts()) == 2, "a completed key must not be sent again"

    async def test_a_scan_while_a_resend_records_its_answer_does_not_resend_the_key(
        self, h: Harness, api: FakePayments
    ) -> None:
        """A resend records two versions, its attempt and then the completion it heard. A scan
        that sees the attempt's version due (its backoff over) while the completion is still on
        its way must not resend the key again: under load the reconciler did, a third request
        for one refund and a second attempt rejected in the key's history."""
        api.script.append("drop")
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund, REFUND)
        port = CompletionHeld(h.stack)
        reconciler = Reconciler(
            {refund.name: refund}, port, clock=h.clock, read_call=h.stack.store.get_call
        )
        assert reconciler.scan([await h.record(KEY)]) == 1

        async def attempted() -> CallRecord | None:
            record = await h.stack.store.get_call(KEY)
            return record if record is not None and record.reconcile_attempts == 1 else None

        between = await until(attempted, timeout=15, what="the resend's attempt in the ledger")
        h.clock.advance(ReconcilePolicy().max_backoff.total_seconds())
        assert is_due(between, reconciler.policy, h.clock())
        assert reconciler.scan([between]) == 0, "resent while its first resend was recording"
        port.release.set()
        await until(lambda: reconciler.busy == 0, timeout=15, what="the resend to finish")
        record = await h.record(KEY, "completed")
        assert record.reconcile_attempts == 1 and len(api.refunds) == 1
        assert len(api.posts()) == 2
        history = await h.stack.store.history(KEY)
        assert [e.event_type for e in history if not e.accepted] == []

    async def test_past_the_window_the_unknown_refund_stays_for_the_operator(
        self, h: Harness, api: FakePayments
    ) -> None:
        """Past the downstream's retention a resend could refund a second time: neither the
        replay nor the reconciler may send it, and the error must say why and what to do."""
        api.script.append("drop")
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund, REFUND)
        h.clock.advance((REPLAY_WINDOW + timedelta(minutes=1)).total_seconds())
        with pytest.raises(ResendWindowPassed) as raised:
            await h.new_ledger().call(
                refund, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=REFUND
            )
        message = str(raised.value)
        assert "past the 1 day, 0:00:00" in message and "toolledger executions resolve" in message
        started, record = await self.reconcile(h, refund)
        assert started == 0 and record.status == "indeterminate"
        assert len(api.posts()) == 1 and len(api.refunds) == 1

    async def test_the_resend_sends_the_arguments_as_recorded_by_reference(
        self, h: Harness, api: FakePayments
    ) -> None:
        """Arguments over the inline threshold are stored as a blob: the resend must send them
        restored, byte for byte as the first request, not the empty inline text."""
        api.script.append("drop")
        arguments = {**REFUND, "memo": "customer wrote: " + "x" * 4000}
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund, arguments)
        assert (await h.record(KEY)).arguments_blob is not None
        _, record = await self.reconcile(h, refund)
        assert record.status == "completed"
        first, again = api.posts()
        assert again.body == first.body and len(api.refunds) == 1

    async def test_an_undeclared_downstream_is_never_resent(
        self, h: Harness, api: FakePayments
    ) -> None:
        """Without `replays_key_for` nothing says a resend is harmless: the unknown call must
        wait for an operator, and the fake must see one request only."""
        api.script.append("drop")
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund_undeclared, UNDECLARED)
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund_undeclared, UNDECLARED)
        started, record = await self.reconcile(h, refund_undeclared)
        assert started == 0 and record.status == "indeterminate"
        assert len(api.posts()) == 1

    async def test_a_4xx_is_failed_with_its_status_and_body(
        self, h: Harness, api: FakePayments
    ) -> None:
        """The server said no: the call must be failed (not unknown, not "not attempted"), with
        the status and the server's reason in the ledger."""
        outcome = await self.call(h, refund, {**REFUND, "amount": 999_999})
        assert (outcome.status, outcome.not_attempted) == ("failed", False)
        assert "400" in (outcome.error or "") and "exceeds" in (outcome.error or "")
        with pytest.raises(ToolCallFailed):
            outcome.result()
        assert api.refunds == {} and len(api.posts()) == 1

    async def test_409_in_progress_is_unknown_and_the_resend_hears_the_answer(
        self, h: Harness, api: FakePayments
    ) -> None:
        """A 409 "in progress" means the key's request is being processed elsewhere: the call
        must be unknown, not failed (the refund is happening), and the resend later must hear
        the stored answer without a second refund."""
        api.script.append("in_progress")
        with pytest.raises(ToolCallIndeterminate, match="in progress"):
            await self.call(h, refund, REFUND)
        assert len(api.refunds) == 1
        _, record = await self.reconcile(h, refund)
        assert record.status == "completed" and len(api.refunds) == 1
        assert len(api.posts()) == 2

    async def test_a_resend_that_meets_a_5xx_learns_nothing_and_is_counted(
        self, h: Harness, api: FakePayments
    ) -> None:
        """A resend that gets no usable answer must not settle the call either way; it is
        ledgered as an attempt with its evidence and the call stays unknown."""
        api.script.extend(["drop", "503"])
        with pytest.raises(ToolCallIndeterminate):
            await self.call(h, refund, REFUND)
        _, record = await self.reconcile(h, refund)
        assert record.status == "indeterminate" and record.reconcile_attempts == 1
        (attempt,) = await self.attempts(h)
        assert "-> 503" in attempt["detail"]

    async def test_a_read_gets_three_attempts(self, h: Harness, api: FakePayments) -> None:
        """A read that meets two 503s must be tried again, up to its three attempts."""
        api.script.extend(["503", "503"])
        outcome = await self.call(h, look_up_charge, {"charge": "ch_1"})
        assert outcome.status == "completed" and outcome.value is not None
        assert outcome.value.amount == 5000
        assert [r.path for r in api.requests] == ["/v1/charges/ch_1"] * 3

    async def test_a_write_gets_one_attempt(self, h: Harness, api: FakePayments) -> None:
        """A refund that meets a 503 must not be sent again by the executor: one request, and
        the call is unknown (the 503 may have come after the effect)."""
        api.script.append("503")
        with pytest.raises(ToolCallIndeterminate, match="503"):
            await self.call(h, refund, REFUND)
        assert len(api.posts()) == 1 and api.refunds == {}
        _, record = await self.reconcile(h, refund)
        assert record.status == "completed" and len(api.refunds) == 1


class TestMemoryHttpTools(HttpToolScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[Harness]:
        async with memory_harness(tmp_path, payload_limits=LIMITS) as h:
            yield h


class TestKafkaPostgresHttpTools(HttpToolScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
        limits = {
            "payload_inline_bytes": LIMITS.inline_bytes,
            "payload_max_bytes": LIMITS.max_bytes,
        }
        async with kafka_postgres_harness(tmp_path, isolated, **limits) as h:
            yield h


del HttpToolScenarios
