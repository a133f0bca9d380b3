"""The resumer's retries, marks and sweeps, in one process on the embedded ledger.

The faust app around `Resumer` only feeds it facts and ticks it
(`tests/integration/test_resumer.py` runs the real `toolledger resumer`); what a failing hook
does to a run is decided here, where every path can be driven quickly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests import builders as b
from tests.integration.procs import until
from tests.unit.test_lifecycle_framework_runs import paused
from tests.unit.test_lifecycle_framework_runs import resumed as run_resumed
from toolledger.events.log import partition_for
from toolledger.events.records import RunRecord
from toolledger.processors.resumer import ResumePolicy, Resumer
from toolledger.wiring.stack import LedgerStack

FAST = ResumePolicy(max_attempts=3, backoff=0.01, max_backoff=0.02)


@pytest.fixture
async def stack() -> AsyncIterator[LedgerStack]:
    stack = await LedgerStack.memory(partitions=4, verify_keys=b.SIGNING_KEY.verify_keys())
    try:
        yield stack
    finally:
        await stack.close()


async def _resumable(stack: LedgerStack, run_id: str) -> RunRecord:
    """A framework run paused awaiting approval of its call c1, then approved."""
    r = b.reserved(run_id, "c1", requires_approval=True)
    for event in (r, paused(run_id, f"{run_id}:c1")):
        assert (await stack.commands.append_and_await(event, 5)).accepted
    verdict = await stack.commands.append_and_await(b.approved(r, 1), 5)
    assert verdict.accepted and verdict.run is not None, verdict.detail
    return verdict.run


def _resumer(stack: LedgerStack, hook: object, policy: ResumePolicy = FAST) -> Resumer:
    async def mark(event: object) -> object:
        return await stack.commands.append_and_await(event, 5)  # type: ignore[arg-type]

    return Resumer(hook, stack.store, mark_failed=mark, policy=policy)  # type: ignore[arg-type]


async def _ticking(resumer: Resumer, done: object, what: str) -> None:
    async def check() -> bool:
        resumer.tick()
        return bool(done())  # type: ignore[operator]

    await until(check, timeout=5, what=what)


async def test_a_hook_that_exits_or_cancels_itself_is_retried_not_obeyed(
    stack: LedgerStack,
) -> None:
    """`sys.exit()` or a stray CancelledError inside a host's hook would have stopped the
    resumer's process or its task: both must count as a failed try, and the next try runs."""
    await _resumable(stack, "r1")
    raised: list[BaseException] = [SystemExit(3), asyncio.CancelledError()]
    resumed: list[str] = []

    async def hook(run: RunRecord) -> None:
        if raised:
            raise raised.pop(0)
        resumed.append(run.run_id)

    resumer = _resumer(stack, hook)
    try:
        resumer.take_partitions(range(4), 4)
        await _ticking(resumer, lambda: resumed, "the third try to resume r1")
        assert resumed == ["r1"] and resumer.resumed == 1 and resumer.gave_up == 0
    finally:
        await resumer.close()


async def test_the_last_failure_marks_the_run_in_the_ledger(stack: LedgerStack) -> None:
    """After `max_attempts` the run must carry the hook's error in its record, and the hook
    must not be called again by this process."""
    await _resumable(stack, "r1")
    calls: list[str] = []

    async def hook(run: RunRecord) -> None:
        calls.append(run.run_id)
        raise ValueError("the model is down")

    resumer = _resumer(stack, hook)
    try:
        resumer.take_partitions(range(4), 4)

        async def marked() -> str | None:
            resumer.tick()
            run = await stack.store.get_run("r1")
            return None if run is None else run.resume_error

        error = await until(marked, timeout=5, what="r1 marked")
        assert "failed 3 times" in error and "ValueError: the model is down" in error
        for _ in range(20):
            resumer.tick()
            await asyncio.sleep(0.005)
        assert calls == ["r1"] * 3 and resumer.gave_up == 1
    finally:
        await resumer.close()


async def test_a_sweep_offers_only_the_runs_of_owned_partitions(stack: LedgerStack) -> None:
    """Two resumers of one group each sweep when they start: each must take only the runs of
    the facts partitions it owns, or every run would be resumed by every member."""
    runs = [await _resumable(stack, f"r{i}") for i in range(8)]
    mine = {partition_for(r.run_id, 4) for r in runs[:2]}
    resumed: list[str] = []

    async def hook(run: RunRecord) -> None:
        resumed.append(run.run_id)

    resumer = _resumer(stack, hook)
    try:
        resumer.take_partitions(mine, 4)
        expected = sorted(r.run_id for r in runs if partition_for(r.run_id, 4) in mine)
        await _ticking(resumer, lambda: len(resumed) == len(expected), "the owned runs resumed")
        assert sorted(resumed) == expected and len(expected) < len(runs)
    finally:
        await resumer.close()


async def test_a_retry_of_a_run_that_moved_on_meanwhile_does_not_call_the_hook(
    stack: LedgerStack,
) -> None:
    """Between tries an operator's host may have resumed the run: the retry must read the run
    again and leave it alone, not resume it a second time."""
    await _resumable(stack, "r1")
    calls: list[str] = []

    async def hook(run: RunRecord) -> None:
        calls.append(run.run_id)
        raise RuntimeError("first try fails")

    resumer = _resumer(stack, hook, ResumePolicy(max_attempts=3, backoff=0.2, max_backoff=0.2))
    try:
        resumer.take_partitions(range(4), 4)
        await _ticking(resumer, lambda: calls, "the first try")
        assert (await stack.commands.append_and_await(run_resumed("r1"), 5)).accepted
        for _ in range(60):
            resumer.tick()
            await asyncio.sleep(0.01)
        assert calls == ["r1"], "the hook was called again for a run that had gone on"
        run = await stack.store.get_run("r1")
        assert run is not None and run.status == "running" and run.resume_error is None
    finally:
        await resumer.close()
