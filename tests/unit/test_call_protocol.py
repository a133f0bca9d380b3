"""The call protocol's waits, on the embedded ledger (memory log, memory store).

A bounded policy (an operator's request) must give up on an outcome's verdict with the
documented error, saying the outcome is in the log, and the outcome must still be applied; every
policy must append an abandon until it lands, also when the log refuses the first tries (the
compensator used to try once and drop it). Kafka being unreachable is the `LogError` the Kafka
adapter raises, injected at the stack's events log, under the real commands and port. And the
runtime must reach the ledger through its port only: `Ledger.stack` is kept for tests and the
drill, never needed by a call or a run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from tests.forwarding_port import Forwarding
from tests.integration.procs import until
from toolledger import (
    AgentConfig,
    AgentRun,
    FinalAnswer,
    Ledger,
    ReconcileOutcome,
    ToolCallRequest,
    ToolContext,
    ToolExecutionRecord,
    Toolset,
    external,
)
from toolledger.api.compensation import RuntimeCompensator
from toolledger.api.errors import Unavailable
from toolledger.errors import LedgerUnavailable
from toolledger.events.codec import decode
from toolledger.events.log import LogError, Position
from toolledger.events.models import CallIndeterminate, call_key
from toolledger.events.records import CallRecord
from toolledger.projections.ownership import MemoryPartitionLocks
from toolledger.projections.projector import Projector
from toolledger.runtime.executor import CallIdentity
from toolledger.runtime.protocol import CallProtocol, CallWaits, OutcomeVerdictPending
from toolledger.runtime.runs import ModelTurn
from toolledger.wiring.stack import LedgerStack

box = Toolset("proto")
voided: list[str] = []
stacks: list[LedgerStack] = []
restarted: list[asyncio.Task[None]] = []


async def void(record: ToolExecutionRecord, context: ToolContext) -> str:
    voided.append(record.key)
    return f"voided {record.key}"


async def void_and_stop_the_projector(record: ToolExecutionRecord, context: ToolContext) -> str:
    """Undoes the charge, then stops the projector, so the outcome's verdict cannot come."""
    await stop_projector(stacks[0])
    return await void(record, context)


@box.tool(external(), compensation=void)
async def charge(amount: int, context: ToolContext) -> str:
    return f"charged {amount}"


@box.tool(external(), compensation=void_and_stop_the_projector)
async def charge_once(amount: int, context: ToolContext) -> str:
    return f"charged {amount}"


@box.tool(external())
async def stamp(note: str, context: ToolContext) -> str:
    await stop_projector(stacks[0])
    return f"stamped {note}"


class RefusingLog:
    """The stack's events log, refusing every append (`LogError`) for `period` seconds once an
    event of type `after` was appended (and calling `then`); `refused` lists what it refused."""

    def __init__(
        self,
        stack: LedgerStack,
        *,
        after: str,
        period: float,
        then: Callable[[], object] = lambda: None,
    ) -> None:
        self.append = stack.commands.events.append
        self.after = after
        self.period = period
        self.then = then
        self.until = 0.0
        self.refused: list[str] = []
        stack.commands.events.append = self._append  # type: ignore[method-assign]

    async def _append(
        self,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        hint: bool = True,
    ) -> Position:
        event_type = decode(value).type
        if time.monotonic() < self.until:
            self.refused.append(event_type)
            raise LogError("the broker is unreachable (refused by the test)")
        position = await self.append(key, value, headers, hint=hint)
        if event_type == self.after:
            self.until = time.monotonic() + self.period
            self.then()
        return position


@pytest.fixture
async def ledger() -> AsyncIterator[Ledger]:
    voided.clear()
    async with await Ledger.memory(verdict_timeout=0.3) as ledger:
        stacks[:] = [ledger.stack]
        yield ledger
        for task in restarted:
            assert ledger.stack.projector is not None
            ledger.stack.projector.stop()
            await task
        restarted.clear()


async def stop_projector(stack: LedgerStack) -> None:
    assert stack.projector is not None
    stack.projector.stop()
    await stack.projector_task


def restart_projector(stack: LedgerStack) -> None:
    projector = Projector(stack.events, stack.store, MemoryPartitionLocks(), fetch_wait_ms=10)
    stack.projector = projector
    restarted.append(asyncio.create_task(projector.run()))


async def settled(ledger: Ledger, key: str, status: str) -> CallRecord:
    async def check() -> CallRecord | None:
        record = await ledger.stack.store.get_call(key)
        return record if record is not None and record.status == status else None

    return await until(check, timeout=5, what=f"{key} to become {status}")


async def charged(ledger: Ledger, tool: Any, run_id: str = "r1") -> CallRecord:
    await ledger.call(
        tool, run_id=run_id, tool_call_id="c1", tenant_id="acme", arguments={"amount": 5}
    )
    return await settled(ledger, call_key(run_id, "c1"), "completed")


def test_a_wait_policy_refuses_a_wait_that_is_not_positive() -> None:
    """A zero timeout would refuse every call at once; a zero resend pause would spin."""
    bads: list[dict[str, float]] = [{"verdict_timeout": 0}, {"resend_every": -1}]
    for bad in [*bads, {"outcome_wait": 0}]:
        with pytest.raises(ValueError, match="must be positive"):
            CallWaits(**bad)  # type: ignore[arg-type]
    assert CallWaits.runtime(3).outcome_wait is None
    assert CallWaits.request(3).outcome_wait == 3


async def test_a_bounded_outcome_wait_raises_the_documented_error_and_the_outcome_still_lands(
    ledger: Ledger,
) -> None:
    """An API request cannot wait forever for a verdict; when it gives up it must say that the
    outcome is in the log (not that the call failed), and the outcome must then be applied."""
    protocol = CallProtocol(ledger.port, CallWaits.request(0.3), clock=ledger.clock)
    who = CallIdentity("r1", "c1", "acme", "r1:c1")
    prepared = stamp.prepare({"note": "n"})
    reserved = protocol.reservation(stamp, prepared, who)
    assert (await protocol.reserve(reserved)).accepted
    ended = await protocol.execute(stamp, prepared, who, reserved)
    landed = await protocol.record(who, reserved, ended)
    started = time.monotonic()
    with pytest.raises(
        OutcomeVerdictPending, match="the outcome is in the log and will be applied"
    ):
        await protocol.await_outcome_verdict(who.key, landed.event.event_id)
    assert time.monotonic() - started < 3, "a bounded wait waited for much longer than its bound"
    restart_projector(ledger.stack)
    record = await settled(ledger, who.key, "completed")
    assert record.result_json == '"stamped n"'


async def test_a_compensation_whose_outcome_has_no_verdict_is_unavailable_not_lost(
    ledger: Ledger,
) -> None:
    """The compensator's request waits for the outcome's verdict only so long, then answers
    503 saying the compensation ran; its outcome is applied once the projector is back."""
    original = await charged(ledger, charge_once)
    compensator = RuntimeCompensator(
        ledger.port, {charge_once.name: charge_once}, verdict_timeout=0.3
    )
    with pytest.raises(Unavailable, match="ran, but its outcome has no verdict yet") as caught:
        await compensator.run(original)
    assert caught.value.code == "ledger_unavailable" and voided == [original.key]
    restart_projector(ledger.stack)
    done = await settled(ledger, original.key + ":compensate", "completed")
    assert done.result_json == f'"voided {original.key}"'
    await compensator.close()


async def test_an_unanswered_compensation_is_abandoned_even_when_the_first_abandons_fail(
    ledger: Ledger,
) -> None:
    """The reservation reached the log but no verdict came, and the log then refused appends
    for longer than a verdict timeout: the abandon must keep being appended until it lands, so
    the reservation, accepted once the projector is back, is failed, not attempted. (Tried once
    and dropped, the compensation stayed `started` until its deadline.)"""
    original = await charged(ledger, charge)
    await stop_projector(ledger.stack)
    refusing = RefusingLog(ledger.stack, after="call_reserved", period=1.0)  # 3 verdict timeouts
    compensator = RuntimeCompensator(ledger.port, {charge.name: charge}, verdict_timeout=0.3)
    with pytest.raises(Unavailable, match=r"was not run.*being abandoned"):
        await compensator.run(original)
    assert await compensator.protocol.wait_background(5)
    assert refusing.refused and set(refusing.refused) == {"call_abandoned"}
    restart_projector(ledger.stack)
    record = await settled(ledger, original.key + ":compensate", "failed")
    assert record.not_attempted and "abandoned" in (record.error or "")
    assert voided == [], "the compensation ran although its reservation was never answered"
    await compensator.close()


async def test_the_reservation_steps_compose_into_a_flow_that_runs_before_the_verdict(
    ledger: Ledger,
) -> None:
    """A pipelined flow appends the reservation, runs the tool while its verdict is awaited and
    records as usual: the split steps must give the same record as `reserve`."""
    protocol = ledger.protocol
    who = CallIdentity("r2", "c1", "acme", "r2:c1")
    prepared = charge.prepare({"amount": 7})
    reserved = protocol.reservation(charge, prepared, who)
    await protocol.append_reservation(reserved)
    running = asyncio.ensure_future(protocol.execute(charge, prepared, who, reserved))
    verdict = await protocol.await_reservation_verdict(reserved)
    ended = await running
    assert verdict.accepted and verdict.call is not None and verdict.call.status == "started"
    landed = await protocol.record(who, reserved, ended)
    outcome = await protocol.await_outcome_verdict(who.key, landed.event.event_id)
    assert outcome.accepted and outcome.call is not None
    assert outcome.call.status == "completed" and outcome.call.result_json == '"charged 7"'


async def test_an_agent_run_and_its_calls_need_nothing_but_the_runtime_port(
    ledger: Ledger,
) -> None:
    """`Ledger` takes any port: a run driven start to end, its twin lookup, its checkpoints and
    a resume of the finished run, on an adapter with no stack under it, must all go through
    that port (a path that reached for `ledger.stack` fails here)."""

    async def model(transcript: list[dict[str, Any]]) -> ModelTurn:
        if any(message.get("role") == "tool" for message in transcript):
            return FinalAnswer("charged")
        return [ToolCallRequest("c1", charge.name, {"amount": 3})]

    port = Forwarding(ledger.port)
    on_port = Ledger(port, verdict_timeout=ledger.verdict_timeout)
    with pytest.raises(AttributeError, match="has no stack"):
        on_port.stack  # noqa: B018 (the property is what is tested)
    agent = AgentConfig(name="cashier")
    run = AgentRun(on_port, run_id="r9", tenant_id="acme", agent=agent, tools=box, model=model)
    result = await run.start("charge 3")
    assert result.status == "completed" and result.answer == "charged"
    assert [m["content"] for m in result.transcript if m.get("role") == "tool"] == ['"charged 3"']
    again = AgentRun(on_port, run_id="r9", tenant_id="acme", agent=agent, tools=box, model=model)
    assert (await again.resume()).status == "completed"
    record = await on_port.read_call("r9:c1")
    assert record is not None and record.result_json == '"charged 3"'
    assert {"read_call", "read_run", "append_and_await", "append_until_landed"} <= set(port.asked)
    await on_port.close()


async def find_the_charge_as_its_outcome_lands(
    record: ToolExecutionRecord, context: ToolContext
) -> ReconcileOutcome:
    """Finds the effect, while the call's own runtime records it unknown (a cancelled caller's
    outcome landing in the background): the record moves on under the question."""
    stack = stacks[0]
    landed = CallIndeterminate(
        key=record.key,
        run_id=record.run_id,
        tool_call_id=record.tool_call_id,
        tenant_id=record.tenant_id,
        reservation_id=record.reservation_id,
        error="cancelled while the tool was running",
    )
    assert (await stack.commands.append_and_await(landed, 5)).accepted
    return ReconcileOutcome(status="completed", value="charged 4")


@box.tool(external(), reconcile=find_the_charge_as_its_outcome_lands)
async def charge_found(amount: int, context: ToolContext) -> str:
    return f"charged {amount}"


async def test_a_replay_whose_finding_meets_a_moved_record_records_what_the_hook_found(
    ledger: Ledger,
) -> None:
    """A resend read the call `started`; its hook found the effect while the first caller's
    `indeterminate` landed. The finding, made for the version read, is rejected as stale; the
    evidence of an effect still holds for the same reservation, so the replay must record it
    against the record as it now is, not answer "unknown" with the effect found."""
    who = CallIdentity("r3", "c1", "acme", "r3:c1")
    prepared = charge_found.prepare({"amount": 4})
    assert (
        await ledger.protocol.reserve(ledger.protocol.reservation(charge_found, prepared, who))
    ).accepted
    outcome = await ledger.call(
        charge_found, run_id="r3", tool_call_id="c1", tenant_id="acme", arguments={"amount": 4}
    )
    assert outcome.status == "completed" and outcome.value == "charged 4" and outcome.replayed
    record = await settled(ledger, who.key, "completed")
    assert record.settled_by == "reconcile"


async def test_a_resend_right_after_a_cancelled_reservation_runs_the_call(ledger: Ledger) -> None:
    """A caller cancelled while its reservation was being decided leaves the call `started`
    until its abandon lands (here the log refuses it for a while). A resend through the same
    process meanwhile must wait for that abandon and run the call, not answer "in progress"
    for a call this process knows it never ran."""
    arguments = {"amount": 6}
    first = asyncio.ensure_future(
        ledger.call(charge, run_id="r4", tool_call_id="c1", tenant_id="acme", arguments=arguments)
    )
    refusing = RefusingLog(ledger.stack, after="call_reserved", period=1.0, then=first.cancel)
    with pytest.raises(asyncio.CancelledError):
        await first
    await settled(ledger, "r4:c1", "started")
    outcome = await ledger.call(
        charge, run_id="r4", tool_call_id="c1", tenant_id="acme", arguments=arguments
    )
    assert outcome.status == "completed" and not outcome.replayed
    assert refusing.refused[0] == "call_abandoned"
    history = [e.event_type for e in await ledger.stack.store.history("r4:c1")]
    assert history == ["call_reserved", "call_abandoned", "call_reserved", "call_completed"]


class Unreadable(Forwarding):
    """The ledger's store cannot be read; Kafka takes appends."""

    async def read_call(self, key: str) -> CallRecord | None:
        self.asked.append("read_call")
        raise LedgerUnavailable("the store is down (injected)")


async def test_a_new_call_whose_key_cannot_be_read_appends_nothing_and_says_why(
    ledger: Ledger,
) -> None:
    """A new call's read and reservation go as one request (`read_or_reserve`). When the read
    fails, nothing was reserved: the call must raise the read's own error, and append neither
    a reservation nor an abandon for a reservation that never was."""
    port = Unreadable(ledger.port)
    on_port = Ledger(port, verdict_timeout=ledger.verdict_timeout)
    before = await ledger.stack.events.end_offsets()
    with pytest.raises(LedgerUnavailable, match="the store is down") as caught:
        await on_port.call(
            charge, run_id="r-down", tool_call_id="c1", tenant_id="acme", arguments={"amount": 1}
        )
    assert type(caught.value) is LedgerUnavailable
    assert port.asked == ["read_or_reserve", "read_call"]
    assert await on_port.wait_background(5)
    assert await ledger.stack.events.end_offsets() == before, "something was appended"
    await on_port.close()
