"""`Ledger` behaviours that need control over the projector or the clock (memory ledger only).

The scenarios both ledgers share are in `tests/contract/test_runtime_scenarios.py`; these stop
and restart the in-process projector, cancel callers and move the clock, which only the
embedded ledger lets a unit test do without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from toolledger import (
    ConfigError,
    Ledger,
    LedgerUnavailable,
    Tool,
    ToolArgumentsError,
    ToolCallAwaitingApproval,
    ToolCallInProgress,
    ToolContext,
    ToolOutcome,
    ToolResultUnreadable,
    Toolset,
    external,
)
from toolledger.events.log import Position
from toolledger.events.models import CallApproved, CallResolved, Event, utcnow
from toolledger.events.records import CallRecord
from toolledger.events.signing import sign
from toolledger.projections.barrier import StaleRead
from toolledger.projections.ownership import MemoryPartitionLocks
from toolledger.projections.projector import Projector
from toolledger.wiring.stack import LedgerStack

ARGS = {"note": "hello"}
box = Toolset("unit")
ran: Counter[str] = Counter()
hooks: dict[str, asyncio.Event] = {}
context_of: dict[str, LedgerStack | Clock] = {}


class Clock:
    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return utcnow() + self.offset


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    hooks.clear()
    hooks["entered"] = asyncio.Event()
    hooks["release"] = asyncio.Event()


@box.tool(external())
async def send(note: str, context: ToolContext) -> str:
    ran["send"] += 1
    async with context.sending():
        return f"{note} ({context.idempotency_key})"


@box.tool(external(approval=True))
async def gated(note: str, context: ToolContext) -> str:
    ran["gated"] += 1
    return context.idempotency_key


@box.tool(external())
async def waits_after_sending(note: str, context: ToolContext) -> str:
    async with context.sending():
        hooks["entered"].set()
        await hooks["release"].wait()
    return note


@box.tool(external())
async def waits_before_sending(note: str, context: ToolContext) -> str:
    hooks["entered"].set()
    await hooks["release"].wait()
    async with context.sending():
        return note


@box.tool(external())
async def outlives_its_deadline(note: str, context: ToolContext) -> str:
    """Moves the test clock past the reservation's deadline before returning."""
    clock = context_of["clock"]
    assert isinstance(clock, Clock)
    clock.offset += timedelta(seconds=outlives_its_deadline.budget + 1)
    return note


@box.tool(external())
async def stops_the_projector(note: str, context: ToolContext) -> str:
    """Returns only once the projector stopped, so its outcome stays unfolded."""
    ran["stops_the_projector"] += 1
    stack = context_of["stack"]
    assert isinstance(stack, LedgerStack) and stack.projector is not None
    stack.projector.stop()
    await stack.projector_task
    return note


@pytest.fixture
async def ledger() -> AsyncIterator[Ledger]:
    clock = Clock()
    ledger = await Ledger.memory(verdict_timeout=0.5, clock=clock)
    context_of["clock"] = clock
    context_of["stack"] = ledger.stack
    yield ledger
    await ledger.close()


async def record_of(ledger: Ledger, key: str, status: str) -> CallRecord:
    give_up = time.monotonic() + 5
    while True:
        record = await ledger.stack.store.get_call(key)
        if record is not None and record.status == status:
            return record
        assert time.monotonic() < give_up, f"{key} never became {status}: {record}"
        await asyncio.sleep(0.01)


def restart_projector(stack: LedgerStack) -> asyncio.Task[None]:
    projector = Projector(stack.events, stack.store, MemoryPartitionLocks(), fetch_wait_ms=10)
    stack.projector = projector
    return asyncio.create_task(projector.run())


async def call(ledger: Ledger, tool: Tool[Any, Any], call_id: str = "c1") -> ToolOutcome[Any]:
    return await ledger.call(
        tool,
        run_id="r1",
        tool_call_id=call_id,
        tenant_id="acme",
        arguments=ARGS,
    )


async def test_no_reservation_verdict_fails_closed_and_abandons_the_reservation(
    ledger: Ledger,
) -> None:
    """With the projector down a call must be refused before the tool runs, and its
    reservation abandoned so that it can never start later behind the caller's back."""
    assert ledger.stack.projector is not None
    ledger.stack.projector.stop()
    await ledger.stack.projector_task
    with pytest.raises(LedgerUnavailable, match="was not attempted"):
        await call(ledger, send)
    assert ran["send"] == 0
    assert await ledger.wait_background(5)
    projector = restart_projector(ledger.stack)
    record = await record_of(ledger, "r1:c1", "failed")
    assert record.not_attempted and "abandoned" in (record.error or "")
    outcome = await call(ledger, send)
    assert outcome.status == "completed" and ran["send"] == 1
    ledger.stack.projector.stop()
    await projector


@pytest.mark.parametrize(
    ("tool", "status", "not_attempted"),
    [(waits_after_sending, "indeterminate", False), (waits_before_sending, "failed", True)],
)
async def test_a_cancelled_caller_leaves_an_honest_outcome(
    ledger: Ledger, tool: Tool[Any, Any], status: str, not_attempted: bool
) -> None:
    """A caller cancelled mid-call must not leave the call `started` until its deadline."""
    task = asyncio.create_task(call(ledger, tool))
    await asyncio.wait_for(hooks["entered"].wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await ledger.wait_background(5)
    record = await record_of(ledger, "r1:c1", status)
    assert record.not_attempted is not_attempted


async def test_an_outcome_inside_the_deadline_returns_on_acknowledgement(ledger: Ledger) -> None:
    outcome = await call(ledger, send)
    assert outcome.record is None and outcome.status == "completed"


async def test_an_outcome_after_the_deadline_awaits_its_verdict(ledger: Ledger) -> None:
    outcome = await call(ledger, outlives_its_deadline)
    assert outcome.record is not None and outcome.record.status == "completed"


async def test_a_read_right_after_a_call_returned_sees_how_it_ended(ledger: Ledger) -> None:
    """The call returns on the log's acknowledgement, before the projector folded its outcome
    (the embedded log acknowledges without a turn of the event loop); `read_call` must not
    answer `started` for a call this process just finished."""
    outcome = await call(ledger, send)
    assert outcome.record is None, "the outcome returned on acknowledgement"
    record = await ledger.read_call("r1:c1")
    assert record is not None and record.status == "completed", record


async def test_a_read_of_an_unfolded_own_outcome_is_stale_after_the_barriers_bound(
    ledger: Ledger,
) -> None:
    """With the projector stopped the outcome is never folded: the read waits out the read
    barrier's bound (0.5 s here) and says it is stale, instead of hanging or answering the
    stored `started` of a call this process knows completed."""
    ledger.stack.reads.barrier.timeout = 0.5
    await call(ledger, stops_the_projector)
    started = time.monotonic()
    with pytest.raises(StaleRead, match="1 record behind"):
        await ledger.read_call("r1:c1")
    assert 0.4 < time.monotonic() - started < 5


async def test_a_replay_right_after_an_acknowledged_outcome_is_not_in_progress(
    ledger: Ledger,
) -> None:
    """This process just completed the call; replaying it must not answer "in progress"
    merely because the projector has not folded the outcome yet."""
    first = await call(ledger, stops_the_projector)
    assert (await record_of(ledger, "r1:c1", "started")).status == "started"
    with pytest.raises(ToolCallInProgress):
        await call(Ledger.from_stack(ledger.stack, verdict_timeout=0.5), stops_the_projector)
    second = asyncio.create_task(call(ledger, stops_the_projector))
    projector = restart_projector(ledger.stack)
    outcome = await asyncio.wait_for(second, 5)
    assert outcome.value == first.value and outcome.replayed
    assert ran["stops_the_projector"] == 1
    assert ledger.stack.projector is not None
    ledger.stack.projector.stop()
    await projector


async def test_arguments_that_do_not_fit_name_the_call_and_the_field(ledger: Ledger) -> None:
    with pytest.raises(ToolArgumentsError, match=r"unit.send \(run r1, call c1\).*note"):
        await ledger.call(send, run_id="r1", tool_call_id="c1", tenant_id="a", arguments={})
    assert await ledger.stack.store.get_call("r1:c1") is None
    with pytest.raises(ValueError, match="run_id without ':'"):
        await ledger.call(send, run_id="r:1", tool_call_id="c1", tenant_id="a", arguments=ARGS)


async def test_the_embedded_ledger_signs_operator_events_with_its_own_key(ledger: Ledger) -> None:
    """Without configured keys, an approval signed by this process must still be accepted."""
    with pytest.raises(ToolCallAwaitingApproval, match="needs an operator's approval"):
        await call(ledger, gated)
    record = await record_of(ledger, "r1:c1", "awaiting_approval")
    key = ledger.embedded_signing_key
    assert key is not None
    approval = CallApproved(
        key=record.key,
        run_id="r1",
        tool_call_id="c1",
        tenant_id="acme",
        operator="alice",
        reason="fine",
        expected_version=record.version,
    )
    verdict = await ledger.stack.commands.append_and_await(sign(approval, key), 5)
    assert verdict.accepted
    assert (await call(ledger, gated)).status == "completed"


async def test_an_operators_result_that_does_not_fit_the_type_is_reported(ledger: Ledger) -> None:
    """An operator may settle a call without a usable value; the caller must hear why."""
    task = asyncio.create_task(call(ledger, waits_after_sending))
    record = await record_of(ledger, "r1:c1", "started")
    clock = context_of["clock"]
    assert isinstance(clock, Clock)
    clock.offset += timedelta(seconds=waits_after_sending.budget + 10)
    key = ledger.embedded_signing_key
    assert key is not None
    resolved = CallResolved(
        key=record.key,
        run_id="r1",
        tool_call_id="c1",
        tenant_id="acme",
        occurred_at=clock(),
        operator="alice",
        reason="found it",
        expected_version=record.version,
        outcome="completed",
        value_json='{"not": "a string"}',
    )
    assert (await ledger.stack.commands.append_and_await(sign(resolved, key), 5)).accepted
    hooks["release"].set()
    outcome = await asyncio.wait_for(task, 5)
    with pytest.raises(ToolResultUnreadable, match="cannot be read as str"):
        outcome.result()


async def test_a_bad_setting_stops_connect_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLLEDGER_PARTITIONS", "0")
    with pytest.raises(ConfigError, match="TOOLLEDGER_PARTITIONS"):
        await Ledger.connect()
    monkeypatch.delenv("TOOLLEDGER_PARTITIONS")
    monkeypatch.delenv("TOOLLEDGER_DATABASE_URL", raising=False)
    monkeypatch.delenv("TOOLLEDGER_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(ConfigError, match="TOOLLEDGER_DATABASE_URL and TOOLLEDGER_KAFKA_BOOTSTRAP"):
        await Ledger.connect()


async def test_a_caller_cancelled_after_the_tool_ran_still_records_its_outcome(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's own timeout firing while the outcome is appended must not lose a result
    that exists: the append carries on without the caller."""
    slow = asyncio.Event()
    original = ledger.stack.commands.append

    async def slow_outcomes(event: Event, timeout: float) -> Position:
        if event.type == "call_completed":
            hooks["entered"].set()
            await slow.wait()
        return await original(event, timeout)

    monkeypatch.setattr(ledger.stack.commands, "append", slow_outcomes)
    task = asyncio.create_task(call(ledger, send))
    await asyncio.wait_for(hooks["entered"].wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    slow.set()
    assert await ledger.wait_background(5)
    assert (await record_of(ledger, "r1:c1", "completed")).result_json == '"hello (r1:c1)"'


async def test_a_caller_cancelled_while_reserving_abandons_the_reservation(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation nobody will act on must not hold the key as `started` until its deadline."""
    assert ledger.stack.projector is not None
    ledger.stack.projector.stop()
    await ledger.stack.projector_task
    original = ledger.stack.commands.append

    async def noting(event: Event, timeout: float) -> Position:
        position = await original(event, timeout)
        if event.type == "call_reserved":
            hooks["entered"].set()
        return position

    monkeypatch.setattr(ledger.stack.commands, "append", noting)
    task = asyncio.create_task(call(ledger, send))
    await asyncio.wait_for(hooks["entered"].wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await ledger.wait_background(5)
    projector = restart_projector(ledger.stack)
    record = await record_of(ledger, "r1:c1", "failed")
    assert record.not_attempted and ran["send"] == 0
    assert ledger.stack.projector is not None
    ledger.stack.projector.stop()
    await projector
