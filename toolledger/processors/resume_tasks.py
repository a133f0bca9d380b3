"""The resumer's hooks in flight: each pause's tries, back-off and mark, as plain asyncio.

A host's resume hook is user code: it may raise, hang on a model, or cancel itself. Whatever it
does must not stop the resumer (the faust agent reading the facts) nor the other runs' hooks,
so each hook runs in a task of its own, at most `concurrency` at a time, and every way it can
end is an outcome here:

- it returns: the pause is resumed (kept until a fact says the run moved on, so a repeated fact
  of the same pause does not call the hook again);
- it raises (any exception, `SystemExit` and a `CancelledError` of its own included, but not
  our cancellation on `close`): logged with the run id and the traceback, and the pause is due
  again after `ResumePolicy.delay` (1 s, 2 s, 4 s... at most `max_backoff`);
- it raised `max_attempts` times: the pause is given up on and the run is marked
  (`run_resume_failed`, appended through `mark_failed` until it lands; a refusal means the run
  moved on meanwhile, which is fine). A resumer that starts tries it again.

Before a retry the run is read again: a run resumed meanwhile (by an operator's host, another
resumer) is not handed to the hook a second time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import Counter

from toolledger.events.models import RunResumeFailed
from toolledger.events.payloads import bounded_text
from toolledger.events.records import RunRecord, Verdict
from toolledger.runtime.pauses import PAUSED

log = logging.getLogger("toolledger.resumer")

HOOKS = Counter(
    "toolledger_resume_hooks",
    "Resume hook calls by outcome: resumed, failed (retried later), gave_up (run marked).",
    ["outcome"],
)

ResumeHook = Callable[[RunRecord], Awaitable[None]]
ReadRun = Callable[[str], Awaitable[RunRecord | None]]
MarkFailed = Callable[[RunResumeFailed], Awaitable[Verdict]]
WaitState = Literal["due", "running", "resumed", "marking", "gave_up"]


@dataclass(frozen=True)
class ResumePolicy:
    """How patiently a failing resume hook is called again."""

    max_attempts: int = 5
    backoff: float = 1.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if not 0 < self.backoff <= self.max_backoff:
            raise ValueError(f"backoff ({self.backoff}) must be in (0, max_backoff]")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure in a row."""
        return min(self.backoff * 2.0 ** min(max(failures - 1, 0), 32), self.max_backoff)


@dataclass
class Wait:
    """One pause the resumer is to end: the run as last read, and how its hook fared."""

    run: RunRecord
    state: WaitState = "due"
    due_at: float = 0.0
    failures: int = 0
    error: str = ""


class ResumeTasks:
    """The pauses of one resumer process, by run_id, and the tasks that call their hooks."""

    def __init__(
        self,
        hook: ResumeHook,
        read_run: ReadRun,
        mark_failed: MarkFailed | None,
        policy: ResumePolicy,
        concurrency: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hook = hook
        self.read_run = read_run
        self.mark_failed = mark_failed
        self.policy = policy
        self.concurrency = concurrency
        self.clock = clock
        self.resumed = 0
        self.gave_up = 0
        self._waits: dict[str, Wait] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def holds(self, run: RunRecord) -> bool:
        """Whether this pause of `run` is already known (due, running, done or given up)."""
        held = self._waits.get(run.run_id)
        return held is not None and held.run.waiting_on == run.waiting_on

    def offer(self, run: RunRecord) -> bool:
        """Make `run`'s pause due now, unless it is already known; True if it was new."""
        if self.holds(run):
            return False
        self._waits[run.run_id] = Wait(run, due_at=self.clock())
        return True

    def forget(self, run_id: str) -> None:
        """The run moved on: drop its pause (a hook in flight finishes unobserved)."""
        self._waits.pop(run_id, None)

    def waiting(self) -> list[Wait]:
        return list(self._waits.values())

    def spawn(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task this object cancels on `close` (at most one per name)."""
        if name in self._tasks:
            work.close()
            return
        task = asyncio.create_task(work, name=f"resumer {name}")
        self._tasks[name] = task
        task.add_done_callback(lambda _: self._tasks.pop(name, None))

    def start_due(self) -> int:
        """Start the hooks (and marks) that are due, up to `concurrency`; how many started."""
        now = self.clock()
        started = 0
        for run_id, wait in list(self._waits.items()):
            if len(self._tasks) >= self.concurrency:
                break
            if wait.due_at > now or run_id in self._tasks:
                continue
            if wait.state == "due":
                wait.state = "running"
                self.spawn(run_id, self._call(wait))
                started += 1
            elif wait.state == "marking":
                self.spawn(run_id, self._mark(wait))
        return started

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _call(self, wait: Wait) -> None:
        run = wait.run
        if wait.failures:
            try:
                fresh = await self.read_run(run.run_id)
            except Exception as exc:
                log.warning("run %s: could not read it before a retry (%r)", run.run_id, exc)
                self._again(wait, "due", self.policy.delay(wait.failures))
                return
            if fresh is None or fresh.status not in PAUSED or fresh.waiting_on != run.waiting_on:
                log.info("run %s moved on before its resume was retried", run.run_id)
                self.forget(run.run_id)
                return
            wait.run = run = fresh
        log.info("run %s may go on (%s settled); resuming", run.run_id, run.waiting_on)
        try:
            await self.hook(run)
        except asyncio.CancelledError:
            if _cancelled_by_us():
                raise
            self._failed(wait, "the hook was cancelled (CancelledError)", None)
        except (Exception, SystemExit) as exc:  # a hook's sys.exit() must not end the resumer
            self._failed(wait, f"{type(exc).__name__}: {exc}", exc)
        else:
            wait.state = "resumed"
            self.resumed += 1
            HOOKS.labels("resumed").inc()

    def _failed(self, wait: Wait, error: str, exc: BaseException | None) -> None:
        run = wait.run
        wait.failures += 1
        wait.error = bounded_text(error)
        if wait.failures < self.policy.max_attempts:
            delay = self.policy.delay(wait.failures)
            HOOKS.labels("failed").inc()
            log.warning(
                "resume hook failed for run %s (waiting on %s), attempt %d of %d: %s; "
                "trying again in %.1fs",
                run.run_id,
                run.waiting_on,
                wait.failures,
                self.policy.max_attempts,
                wait.error,
                delay,
                exc_info=exc,
            )
            self._again(wait, "due", delay)
            return
        self.gave_up += 1
        HOOKS.labels("gave_up").inc()
        log.error(
            "resume hook failed for run %s (waiting on %s) %d times, the last with %s; the run "
            "is marked with the error and stays paused: fix the hook and restart the resumer, "
            "which tries every run whose wait is over again",
            run.run_id,
            run.waiting_on,
            wait.failures,
            wait.error,
            exc_info=exc,
        )
        self._again(wait, "marking", 0.0)

    async def _mark(self, wait: Wait) -> None:
        run = wait.run
        if self.mark_failed is None or run.tenant_id is None or run.waiting_on is None:
            wait.state = "gave_up"
            return
        event = RunResumeFailed(
            key=run.run_id,
            run_id=run.run_id,
            tenant_id=run.tenant_id,
            waiting_on=run.waiting_on,
            attempts=wait.failures,
            error=wait.error,
        )
        try:
            verdict = await self.mark_failed(event)
        except Exception as exc:
            delay = self.policy.delay(wait.failures)
            log.warning(
                "run %s: its resume failure not recorded (%r); again in %.1fs",
                run.run_id,
                exc,
                delay,
            )
            self._again(wait, "marking", delay)
            return
        wait.state = "gave_up"
        if not verdict.accepted:
            log.info("run %s was not marked: %s", run.run_id, verdict.detail)

    def _again(self, wait: Wait, state: WaitState, delay: float) -> None:
        wait.state = state
        wait.due_at = self.clock() + delay


def _cancelled_by_us() -> bool:
    """Whether the current task was asked to stop (`close`), not cancelled by its own hook."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
