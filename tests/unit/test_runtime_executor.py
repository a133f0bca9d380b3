"""The executor's table: how each way a tool can end becomes completed, failed or unknown.

No ledger here: `execute()` is run directly, so each row of the table in
`toolledger/runtime/executor.py` is one small test.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from toolledger import (
    SideEffect,
    Tool,
    ToolContext,
    ToolFailedError,
    ToolNotAttemptedError,
    Toolset,
    external,
    read,
    write,
)
from toolledger.events.models import utcnow
from toolledger.runtime.executor import (
    Attempted,
    CallIdentity,
    Completed,
    Failed,
    Indeterminate,
    execute,
)

WHO = CallIdentity("r1", "c1", "acme", "r1:c1")
box = Toolset("box")
seen: Counter[str] = Counter()
sending = {"entered": asyncio.Event()}


@pytest.fixture(autouse=True)
def _reset() -> None:
    seen.clear()
    sending["entered"] = asyncio.Event()


@box.tool(write(), timeout=0.1)
async def marks_then_hangs(context: ToolContext) -> str:
    seen["marks_then_hangs"] += 1
    async with context.sending():
        await asyncio.sleep(10)
    return "never"


@box.tool(write(), timeout=30)
async def marks_then_waits(context: ToolContext) -> str:
    async with context.sending():
        sending["entered"].set()
        await asyncio.sleep(30)
    return "never"


@box.tool(write(), timeout=0.1)
async def hangs_before_sending(context: ToolContext) -> str:
    seen["hangs_before_sending"] += 1
    await asyncio.sleep(10)
    async with context.sending():
        return "never"


@box.tool(write())
async def never_marks(context: ToolContext) -> str:
    """No `sending()` anywhere: every error counts as after sending."""
    seen["never_marks"] += 1
    raise ConnectionResetError("reset")


@box.tool(external())
async def refuses(context: ToolContext) -> str:
    raise ToolNotAttemptedError("token expired")


@box.tool(external())
async def refuses_after_sending(context: ToolContext) -> str:
    async with context.sending():
        raise ToolNotAttemptedError("the gateway says it dropped the request unread")


@box.tool(external())
async def declined(context: ToolContext) -> str:
    async with context.sending():
        raise ToolFailedError("card declined")


@box.tool(read(backoff=0.01))
async def always_down(context: ToolContext) -> str:
    seen["always_down"] += 1
    raise OSError("down")


@box.tool(read(backoff=0.01))
async def lookup_refused(context: ToolContext) -> str:
    seen["lookup_refused"] += 1
    raise ToolNotAttemptedError("no credentials")


@box.tool(SideEffect("write", attempts=3))
async def write_declaring_retries(context: ToolContext) -> str:
    seen["write_declaring_retries"] += 1
    async with context.sending():
        raise TimeoutError("no answer")


async def run(tool: Tool[Any, Any], **kw: Any) -> Attempted:
    return await execute(tool, tool.prepare({}), WHO, clock=utcnow, **kw)


async def test_a_write_timing_out_after_sending_is_indeterminate() -> None:
    ended = await run(marks_then_hangs)
    assert ended == Indeterminate("timed out after 0.1s", "TimeoutError", 1)
    assert seen["marks_then_hangs"] == 1


async def test_a_write_timing_out_before_sending_was_not_attempted() -> None:
    ended = await run(hangs_before_sending)
    assert isinstance(ended, Failed) and ended.not_attempted


async def test_a_tool_that_never_marks_sending_is_treated_as_sending() -> None:
    ended = await run(never_marks)
    assert isinstance(ended, Indeterminate) and "ConnectionResetError" in ended.error


async def test_not_attempted_is_believed_anywhere() -> None:
    for tool in (refuses, refuses_after_sending):
        ended = await run(tool)
        assert isinstance(ended, Failed) and ended.not_attempted, tool.name


async def test_a_definite_refusal_is_failed() -> None:
    ended = await run(declined)
    assert ended == Failed("ToolFailedError: card declined", "ToolFailedError", False, 1)


async def test_a_read_is_tried_three_times_then_failed() -> None:
    ended = await run(always_down)
    assert isinstance(ended, Failed) and ended.attempts == 3 and seen["always_down"] == 3


async def test_a_read_that_was_refused_is_not_retried() -> None:
    """Retrying an expired credential three times only delays the answer."""
    ended = await run(lookup_refused)
    assert isinstance(ended, Failed) and ended.not_attempted and seen["lookup_refused"] == 1


async def test_a_write_declaring_retries_still_gets_one_attempt() -> None:
    """Guarantee 3 does not depend on the declaration being right."""
    ended = await run(write_declaring_retries)
    assert isinstance(ended, Indeterminate) and seen["write_declaring_retries"] == 1


async def test_a_cancelled_call_reports_how_far_it_got() -> None:
    """A caller that gives up mid-call must leave an honest outcome behind, not `started`."""
    got: list[Attempted] = []
    task = asyncio.create_task(run(marks_then_waits, on_cancel=got.append))
    await asyncio.wait_for(sending["entered"].wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == [Indeterminate("cancelled while the tool was running", "Cancelled", 1)]


async def test_a_completed_attempt_carries_its_stored_result() -> None:
    @box.tool(read())
    async def fine(context: ToolContext) -> int:
        return context.attempt

    ended = await run(fine)
    assert ended == Completed(value=1, result_json="1", attempts=1)
