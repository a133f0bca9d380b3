"""`BackgroundAppends.start`: an outcome's append started at once, finished in a task if it waits.

The call protocol starts every outcome's append with it (`CallProtocol.recording`), so it must
keep what `spawn` promised (the work lands although its caller is cancelled, it is tracked until
it ends, closing cancels what is left) and add only this: work that never suspends is done
before `start` returns, with no task; work that suspends goes on from where it stopped, seeing
what it awaited, what a task throws into it, and its own context.
"""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from toolledger.runtime.recording import BackgroundAppends

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="caller")


async def _immediate(steps: list[str]) -> str:
    steps.append("ran")
    return "landed"


async def _waits_for(gate: asyncio.Future[str], steps: list[str]) -> str:
    steps.append("before")
    got = await gate
    steps.append(f"after {got}")
    return f"landed {got}"


async def test_work_that_never_suspends_is_done_on_return_without_a_task() -> None:
    background = BackgroundAppends()
    steps: list[str] = []
    landing = background.start(_immediate(steps), "immediate")
    assert landing.done() and landing.result() == "landed"
    assert steps == ["ran"] and len(background) == 0
    assert not isinstance(landing, asyncio.Task)


async def test_work_that_suspends_goes_on_in_a_task_from_where_it_stopped() -> None:
    background = BackgroundAppends()
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    steps: list[str] = []
    landing = background.start(_waits_for(gate, steps), "waits")
    assert steps == ["before"], "it ran up to its first suspension before returning"
    assert not landing.done() and len(background) == 1
    await asyncio.sleep(0)
    gate.set_result("ack")
    assert await landing == "landed ack"
    assert steps == ["before", "after ack"]
    await asyncio.sleep(0)  # done callbacks run on the next turn
    assert len(background) == 0


async def test_work_yielding_bare_turns_and_several_futures_ends_with_its_value() -> None:
    async def turns() -> int:
        total = 0
        for n in range(5):
            await asyncio.sleep(0)
            total += await asyncio.sleep(0.001, result=n)
        return total

    landing = BackgroundAppends().start(turns(), "turns")
    assert await landing == 10


async def test_an_error_before_or_after_suspending_is_the_landings() -> None:
    async def fails_at_once() -> None:
        raise ValueError("refused at once")

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise ValueError("refused later")

    background = BackgroundAppends()
    at_once = background.start(fails_at_once(), "at once")
    assert at_once.done()
    with pytest.raises(ValueError, match="refused at once"):
        at_once.result()
    with pytest.raises(ValueError, match="refused later"):
        await background.start(fails_later(), "later")


async def test_a_caller_cancelled_while_waiting_does_not_cancel_the_work() -> None:
    background = BackgroundAppends()
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    steps: list[str] = []
    landing = background.start(_waits_for(gate, steps), "shielded")

    async def caller() -> str:
        return await asyncio.shield(landing)

    waiting = asyncio.create_task(caller())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set_result("ack")
    assert await background.wait(1.0)
    assert landing.result() == "landed ack" and steps[-1] == "after ack"


async def test_closing_throws_the_cancellation_into_the_work_where_it_waits() -> None:
    background = BackgroundAppends()
    seen: list[str] = []

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled where it waited")
            raise

    landing = background.start(stuck(), "stuck")
    await background.close(grace=0.01)
    assert landing.cancelled() and seen == ["cancelled where it waited"]
    assert len(background) == 0


async def test_work_runs_in_a_context_of_its_own_before_and_after_suspending() -> None:
    async def sets_and_waits() -> tuple[str, str]:
        before = where.get()
        where.set("work")
        await asyncio.sleep(0)
        return before, where.get()

    where.set("caller")
    landing = BackgroundAppends().start(sets_and_waits(), "context")
    assert where.get() == "caller", "the work's first step set nothing in the caller's context"
    assert await landing == ("caller", "work")
    assert where.get() == "caller"


async def test_a_timeout_entered_before_the_first_suspension_bounds_the_work_not_the_caller() -> (
    None
):
    """An outcome's append bounded by `asyncio.timeout` (a leader's answer, a Kafka try) that
    suspends inside that bound must time out itself: the CI drill's runtime workers died of a
    CancelledError when a killed leader's bound ran out, because the first step ran in the
    caller's task and the timeout cancelled the caller instead."""
    background = BackgroundAppends()

    async def bounded() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out itself"
        return "unreachable"

    async def caller() -> str:
        landing = background.start(bounded(), "bounded")
        return await asyncio.shield(landing)

    assert await asyncio.create_task(caller()) == "timed out itself"
