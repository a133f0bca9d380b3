"""A reconcile hook is user code: however it fails, the reconciler records an attempt, backs
off, and goes on; it neither dies nor asks the hook in a tight loop with nothing recorded.

On the embedded ledger, with the `Reconciler` the faust app drives (its table and timer only
hand it records).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.builders import indeterminate, reserved
from tests.integration.procs import until
from toolledger import ReconcileOutcome, ToolContext, Toolset, external
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord
from toolledger.processors.reconciler import Reconciler
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

LIMITS = PayloadLimits(inline_bytes=1024, max_bytes=4096)
asked: list[str] = []
answers: list[Any] = []
desk = Toolset("desk")


async def _hook(record: CallRecord, context: ToolContext) -> ReconcileOutcome:
    asked.append(record.key)
    answer = answers.pop(0) if answers else ReconcileOutcome(status="unknown")
    if isinstance(answer, BaseException):
        raise answer
    assert isinstance(answer, ReconcileOutcome)
    return answer


@desk.tool(external(), reconcile=_hook)
async def stamp(form: str, context: ToolContext) -> str:
    """Stamp a form."""
    return form


@pytest.fixture
async def stack() -> AsyncIterator[LedgerStack]:
    asked.clear()
    answers.clear()
    stack = await LedgerStack.memory(partitions=2, limits=LIMITS)
    try:
        yield stack
    finally:
        await stack.close()


async def _unknown(stack: LedgerStack) -> CallRecord:
    r = reserved("r1", "c1").model_copy(update={"tool": "desk.stamp"})
    for event in (r, indeterminate(r, t=5)):
        verdict = await stack.commands.append_and_await(event, timeout=5)
    assert verdict.call is not None
    return verdict.call


async def _one_attempt(stack: LedgerStack, record: CallRecord) -> CallRecord:
    """Scan `record` until the reconciler is idle again; the call as it is then."""
    reconciler = Reconciler({"desk.stamp": stamp}, StackPort(stack), retry_after=0.05)
    try:
        reconciler.scan([record])
        await until(lambda: reconciler.busy == 0, timeout=5, what="the question to end")
        for _ in range(10):  # scans right after: a hook asked again at once would show here
            reconciler.scan([record])
            await asyncio.sleep(0.01)
        await until(lambda: reconciler.busy == 0, timeout=5, what="the scans to end")
    finally:
        await reconciler.close()
    now = await stack.store.get_call(record.key)
    assert now is not None
    return now


async def test_a_hook_whose_value_cannot_be_recorded_counts_as_an_attempt(
    stack: LedgerStack,
) -> None:
    """A hook answering `completed` with a value over TOOLLEDGER_PAYLOAD_MAX_BYTES used to be
    asked again every second, forever, with nothing in the call's history: the finding could
    not be recorded, and the error went to the log only. It must be one recorded attempt,
    counted and backed off like any unknown answer, saying why."""
    record = await _unknown(stack)
    answers.append(ReconcileOutcome(status="completed", value="x" * 10_000))
    now = await _one_attempt(stack, record)
    assert asked == [record.key]
    assert (now.status, now.reconcile_attempts) == ("indeterminate", 1)
    history = await stack.store.history(record.key)
    assert history[-1].event_type == "reconcile_attempted" and history[-1].accepted
    assert "could not be recorded" in history[-1].event_json
    assert "TOOLLEDGER_PAYLOAD_MAX_BYTES" in history[-1].event_json


@pytest.mark.parametrize(
    "raised",
    [SystemExit(2), asyncio.CancelledError(), RuntimeError("lookup service down")],
    ids=["exit", "cancelled", "error"],
)
async def test_a_hook_that_raises_anything_is_an_unknown_answer(
    stack: LedgerStack, raised: BaseException
) -> None:
    """`sys.exit()` inside a hook used to end the reconciler's process, and a hook's stray
    CancelledError made the reconciler ask again at once, forever, recording nothing. Each
    must be one recorded attempt naming what the hook raised."""
    record = await _unknown(stack)
    answers.append(raised)
    now = await _one_attempt(stack, record)
    assert asked == [record.key]
    assert (now.status, now.reconcile_attempts) == ("indeterminate", 1)
    history = await stack.store.history(record.key)
    assert history[-1].event_type == "reconcile_attempted"
    assert type(raised).__name__ in history[-1].event_json
