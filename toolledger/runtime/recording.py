"""Recording what happened: outcome events, background appends, and outcomes acknowledged early.

Three small pieces the call protocol (`toolledger.runtime.protocol`) and `Ledger` need once a
tool has run, kept apart from their control flow:

- `outcome_event` turns the executor's answer into the request the decider folds.
- `BackgroundAppends` keeps the tasks that append what must land whether or not anybody still
  waits for it: the `abandoned` of a reservation whose verdict never came (or whose caller was
  cancelled while waiting), and every outcome, so that a caller cancelled after its tool ran
  does not take the outcome down with it. They are kept referenced (an unreferenced task can
  be collected mid-flight) and closing gives them a moment to land.
- `OwnWrites` remembers what this process appended for a key that the projector may not have
  folded yet: an outcome returned on Kafka's acknowledgement, and what is being appended in
  the background (an abandon, a cancelled caller's outcome). Without it, this process
  replaying such a key a millisecond later would read `started` and answer "in progress" for
  a call it just completed, or "unknown" for one it knows it never ran; with it, it awaits that
  event's verdict instead. It is bounded: a process more than `limit` calls ahead of its
  projector falls back to the honest "in progress".
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from asyncio.tasks import _enter_task, _leave_task
from collections import OrderedDict
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

from toolledger.events.models import CallCompleted, CallFailed, CallIndeterminate
from toolledger.events.payloads import bounded_text
from toolledger.port import Envelope
from toolledger.runtime.executor import Attempted, Completed, Indeterminate

log = logging.getLogger("toolledger.runtime")


Outcome = CallCompleted | CallFailed | CallIndeterminate
T = TypeVar("T")


def outcome_event(envelope: Envelope, reservation_id: uuid.UUID, ended: Attempted) -> Outcome:
    """The `completed` / `failed` / `indeterminate` request for how the tool ended."""
    if isinstance(ended, Completed):
        return CallCompleted(
            **envelope, reservation_id=reservation_id, result_json=ended.result_json
        )
    if isinstance(ended, Indeterminate):
        return CallIndeterminate(
            **envelope,
            reservation_id=reservation_id,
            error=bounded_text(ended.error),
            error_type=ended.error_type,
        )
    return CallFailed(
        **envelope,
        reservation_id=reservation_id,
        error=bounded_text(ended.error),
        error_type=ended.error_type,
        not_attempted=ended.not_attempted,
    )


def unrecordable_event(envelope: Envelope, outcome: Outcome, why: str) -> CallIndeterminate:
    """What is known when the outcome itself cannot be recorded: the tool ran, nobody can say
    from the ledger what it did. Settled by reconcile or an operator like any unknown call."""
    return CallIndeterminate(
        **envelope,
        reservation_id=outcome.reservation_id,
        error=bounded_text(
            f"the tool ran ({outcome.type}), but its outcome could not be recorded: {why}"
        ),
        error_type="ToolResultUnrecordable",
    )


class BackgroundAppends:
    """Tasks appending events nobody awaits, kept until they finish."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Tasks of work `start` finished in its first step, kept until they have ended.
        self._ending: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(work, name=f"toolledger: {name}")
        self._keep(task)
        return task

    def start(self, work: Coroutine[Any, Any, T], name: str) -> asyncio.Future[T]:
        """`spawn`, but run `work` at once up to its first suspension, as Python 3.12's eager
        tasks do: work that never suspends (an append to the embedded log) is done on return,
        with no turn of the event loop; work that suspends goes on from there in its task.
        Either way it runs in a context of its own and a cancelled caller cannot cancel it (no
        await of the caller's lies between its start and its first suspension).

        The first step runs as the task that will go on with it (`asyncio.current_task()` is
        that task), not as the caller: a timeout entered there (`asyncio.timeout`, aiokafka's
        and asyncpg's) must cancel the work when it runs out, never its caller, which used to
        die of a `CancelledError` when a leader's bound ran out mid-append (the CI drill). So
        the task exists from the start; when the work did not suspend, it only ends.
        """
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        step = _FirstStep(work)
        task = loop.create_task(step.rest(), name=f"toolledger: {name}", context=context)
        caller = asyncio.current_task(loop)
        if caller is not None:
            _leave_task(loop, caller)
        _enter_task(loop, task)
        try:
            context.run(step.run)
        finally:
            _leave_task(loop, task)
            if caller is not None:
                _enter_task(loop, caller)
        if step.suspended:
            self._keep(task)
            return task
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        future: asyncio.Future[T] = loop.create_future()
        if step.error is not None:
            future.set_exception(step.error)
        else:
            future.set_result(step.value)
        return future

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every task; True if none is left."""
        end = time.monotonic() + timeout
        while self._tasks and time.monotonic() < end:
            await asyncio.wait(set(self._tasks), timeout=max(end - time.monotonic(), 0))
        return not self._tasks

    async def close(self, grace: float) -> None:
        """Give the tasks `grace` seconds, then cancel the rest, saying which."""
        await asyncio.gather(*self._ending)  # each ends at its first turn
        if await self.wait(grace):
            return
        late = set(self._tasks)
        for task in late:
            log.error(
                "%s did not land before the ledger closed; it is cancelled. Check the key in "
                "`toolledger executions` once the ledger is reachable.",
                task.get_name(),
            )
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


class _Resumed:
    """Awaiting it goes on with a coroutine already started, from where it suspended: it hands
    the task what the coroutine suspended on, then whatever the task sends or throws back."""

    def __init__(self, work: Coroutine[Any, Any, Any], first: Any) -> None:
        self._work = work
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        work, waiting = self._work, self._first
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # what the task throws in (a cancellation) goes on
                try:
                    waiting = work.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    waiting = work.send(sent)
                except StopIteration as done:
                    return done.value


class _FirstStep:
    """`work` run up to its first suspension (`run`), and the rest of it for its task (`rest`)."""

    def __init__(self, work: Coroutine[Any, Any, Any]) -> None:
        self.work = work
        self.suspended = False
        self.waiting: Any = None
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.waiting = self.work.send(None)
        except StopIteration as done:
            self.value = done.value
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            self.error = exc
        else:
            self.suspended = True

    async def rest(self) -> Any:
        """What is left of the work once it suspended (nothing, if it did not)."""
        if self.suspended:
            return await _Resumed(self.work, self.waiting)
        return None


class OwnWrites:
    """key -> (reservation_id, event_id) of this process's latest event for the key."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._entries: OrderedDict[str, tuple[uuid.UUID, uuid.UUID]] = OrderedDict()

    def remember(self, key: str, reservation_id: uuid.UUID, event_id: uuid.UUID) -> None:
        self._entries[key] = (reservation_id, event_id)
        self._entries.move_to_end(key)
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def get(self, key: str, reservation_id: uuid.UUID) -> uuid.UUID | None:
        """The event_id appended for this reservation of `key`, if remembered."""
        entry = self._entries.get(key)
        return entry[1] if entry is not None and entry[0] == reservation_id else None

    def replace(self, key: str, event_id: uuid.UUID, by: uuid.UUID) -> None:
        """Remember `by` instead of `event_id` (an outcome replaced by another), if it is it."""
        entry = self._entries.get(key)
        if entry is not None and entry[1] == event_id:
            self._entries[key] = (entry[0], by)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)
