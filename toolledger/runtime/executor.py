"""Running a tool: attempts, timeouts, and what each way of ending means for the ledger.

The executor knows nothing about the ledger; it turns one run of a tool into one of three
answers, which the ledger records as `completed`, `failed` or `indeterminate`:

| the attempt ended with                            | read                 | any other effect |
|---------------------------------------------------|----------------------|------------------|
| a return value                                    | completed            | completed        |
| `ToolNotAttemptedError` (anywhere)                | failed, not attempted| failed, not att. |
| `ToolFailedError` (the other system said no)      | failed               | failed           |
| another error or the timeout, before `sending()`  | retried, then failed | failed, not att. |
| another error or the timeout, after `sending()`   | retried, then failed | indeterminate    |

"Before `sending()`" only exists for a tool whose code marks it (`Tool.marks_sending`); for any
other tool every error counts as after. A read gets `effect.max_attempts` attempts with jittered
exponential backoff; anything else gets exactly one, whatever its declaration says, because a
second attempt of a write is the double refund this library exists to prevent.

If the task running the tool is cancelled (the caller gave up), the answer for that moment is
computed the same way and handed to `on_cancel` before the cancellation propagates, so the ledger
can record it instead of leaving the call `started` until its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from toolledger.port import Envelope
from toolledger.runtime.context import ToolContext
from toolledger.runtime.errors import ToolFailedError, ToolNotAttemptedError
from toolledger.runtime.tools import PreparedCall, Tool

log = logging.getLogger("toolledger.runtime")


@dataclass(frozen=True)
class Completed:
    """The tool returned `value` (stored as `result_json`)."""

    value: Any
    result_json: str
    attempts: int


@dataclass(frozen=True)
class Failed:
    """The call definitely had no effect; `not_attempted` if nothing was sent at all."""

    error: str
    error_type: str
    not_attempted: bool
    attempts: int


@dataclass(frozen=True)
class Indeterminate:
    """A request may have left and no answer came back."""

    error: str
    error_type: str
    attempts: int


Attempted = Completed | Failed | Indeterminate


@dataclass(frozen=True)
class CallIdentity:
    """Who the tool runs for: what every attempt's `ToolContext` carries."""

    run_id: str
    tool_call_id: str
    tenant_id: str
    key: str


def envelope(who: CallIdentity, at: datetime) -> Envelope:
    """The envelope of a call event about `who`, occurring `at`."""
    return {
        "key": who.key,
        "run_id": who.run_id,
        "tool_call_id": who.tool_call_id,
        "tenant_id": who.tenant_id,
        "occurred_at": at,
    }


async def execute(
    tool: Tool[Any, Any],
    prepared: PreparedCall,
    who: CallIdentity,
    *,
    clock: Callable[[], datetime],
    on_cancel: Callable[[Attempted], None] | None = None,
) -> Attempted:
    """Run `tool` with its retry rule and classify how it ended."""
    attempts = tool.effect.max_attempts
    attempt = 1
    while True:
        context = ToolContext(
            run_id=who.run_id,
            tool_call_id=who.tool_call_id,
            tenant_id=who.tenant_id,
            attempt=attempt,
            deadline=clock() + timedelta(seconds=tool.timeout),
            tool=tool.name,
            idempotency_key=who.key,
        )
        kwargs = {**prepared.values, tool.context_param.name: context}
        timer = asyncio.timeout(tool.timeout)
        try:
            async with timer:
                value = await tool.fn(**kwargs)
        except asyncio.CancelledError:
            if on_cancel is not None:
                ended = classify(tool, context, "cancelled while the tool was running", "Cancelled")
                answer = ended(attempt, final=True)
                if answer is not None:
                    on_cancel(answer)
            raise
        except Exception as exc:
            if timer.expired():
                error, error_type = f"timed out after {tool.timeout:g}s", "TimeoutError"
            else:
                error, error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
            ended = classify(tool, context, error, error_type, exc)
            answer = ended(attempt, final=attempt >= attempts)
            if answer is not None:
                return answer
            delay = tool.effect.backoff_before(attempt + 1)
            log.info(
                "%s (%s) attempt %d of %d failed (%s); retrying in %.3fs",
                tool.name,
                who.key,
                attempt,
                attempts,
                error,
                delay,
            )
            await asyncio.sleep(delay)
            attempt += 1
        else:
            return Completed(value=value, result_json=tool.dump_result(value), attempts=attempt)


@dataclass(frozen=True)
class _Ending:
    """How one attempt ended, before knowing whether it was the last."""

    error: str
    error_type: str
    not_attempted: bool
    retry: bool
    unknown: bool

    def __call__(self, attempt: int, *, final: bool) -> Failed | Indeterminate | None:
        """The answer after `attempt`, or None to try again."""
        if self.retry and not final:
            return None
        if self.unknown:
            return Indeterminate(self.error, self.error_type, attempt)
        return Failed(self.error, self.error_type, self.not_attempted, attempt)


def classify(
    tool: Tool[Any, Any],
    context: ToolContext,
    error: str,
    error_type: str,
    exc: BaseException | None = None,
) -> _Ending:
    """How an attempt that raised ended (see the table in the module docstring)."""
    if isinstance(exc, ToolNotAttemptedError):
        return _Ending(error, error_type, not_attempted=True, retry=False, unknown=False)
    if isinstance(exc, ToolFailedError):
        return _Ending(error, error_type, not_attempted=False, retry=False, unknown=False)
    before_sending = tool.marks_sending and not context.sent
    if not tool.effect.changes_something:
        return _Ending(error, error_type, not_attempted=before_sending, retry=True, unknown=False)
    return _Ending(
        error, error_type, not_attempted=before_sending, retry=False, unknown=not before_sending
    )
