"""Waiting for verdicts: "append, then await a durable verdict".

Verdicts are rows keyed by event_id, written in the projector's transaction, which also sends
one `pg_notify` per verdict. PostgreSQL delivers a notification only after its transaction
commits, so a notification that carries the verdict carries a committed, durable one: its
payload is `<event_id> <verdict JSON>`, the JSON byte for byte what the `verdicts` row holds,
and a waiter takes the verdict from it without reading the table. A verdict too large for a
payload (PostgreSQL refuses one of `NOTIFY_PAYLOAD_LIMIT` bytes), like every verdict of a large
catch-up batch (`toolledger.projections.postgres` says why), is announced by its event_id alone,
which only says "look now"; so is every verdict from a projector older than this one.

Arrival is never trusted: every pending event_id is re-read from `verdicts` on such a hint,
after the listener reconnects, and every 50 ms regardless while anything is pending, so a lost
notification or a killed LISTEN connection costs at most one poll interval, never a verdict; a
waiter that had nothing pending for a second stops ticking until something is (idle means
idle). One LISTEN connection serves every waiter of the process; one query reads all pending
event_ids at once.

A command registers its event_id (`expect`) before appending the event, so no notification for
it can arrive before its waiter: its wait then needs no read of its own, and under load the
waiter reads only for the hints and ticks that find something pending. A `wait` without a prior
`expect` (an event appended earlier, whose verdict may be in the table already) reads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from toolledger.errors import LedgerUnavailable, seconds
from toolledger.events.records import Verdict
from toolledger.projections.dberrors import database_errors
from toolledger.projections.listening import PostgresListener, stop_task

log = logging.getLogger("toolledger.verdicts")

POLL_INTERVAL = 0.05
#: Ticks with nothing pending before the waiter stops ticking (a second): calls that come
#: closer together than that find it ticking, as it always did, instead of waking it each.
QUIET_TICKS = 20
#: PostgreSQL's bound on a notification payload: it must be shorter than this many bytes.
NOTIFY_PAYLOAD_LIMIT = 8000


class VerdictSource(ABC):
    """Reads durable verdicts by event_id."""

    @abstractmethod
    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]: ...


class VerdictWaiter:
    """Resolves `wait(event_id)` futures from a `VerdictSource`, woken by hints and a timer."""

    def __init__(self, source: VerdictSource, poll_interval: float = POLL_INTERVAL) -> None:
        self._source = source
        self._poll_interval = poll_interval
        self._pending: dict[uuid.UUID, list[asyncio.Future[Verdict]]] = {}
        self._wake = asyncio.Event()
        self._armed = asyncio.Event()  # set when something becomes pending (wakes a quiet loop)
        self._task: asyncio.Task[None] | None = None
        self.polls = 0

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="toolledger-verdict-waiter")

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        for futures in self._pending.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(LedgerUnavailable("the ledger client was closed"))
        self._pending.clear()

    def hint(self, event_id: uuid.UUID | None = None) -> None:
        """Something may have been decided (a notification, a reconnect): look now."""
        if event_id is None or event_id in self._pending:
            self._wake.set()

    def waits_for(self, event_id: uuid.UUID) -> bool:
        """Whether anybody here waits for `event_id`'s verdict."""
        return event_id in self._pending

    def deliver(self, verdict: Verdict) -> None:
        """A committed verdict (from its notification, or an in-process projector): its waiters
        have it without a read."""
        for fut in self._pending.pop(verdict.event_id, ()):
            if not fut.done():
                fut.set_result(verdict)

    def expect(self, event_id: uuid.UUID) -> asyncio.Future[Verdict]:
        """Register for `event_id`'s verdict before its event is appended; pass the result to
        `wait`, and to `discard` if the event is never appended."""
        fut: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(event_id, []).append(fut)
        self._armed.set()
        return fut

    def discard(self, event_id: uuid.UUID, fut: asyncio.Future[Verdict]) -> None:
        """Drop a registration nobody waits on any more (done or not)."""
        futures = self._pending.get(event_id)
        if futures is not None and fut in futures:
            futures.remove(fut)
            if not futures:
                del self._pending[event_id]

    async def wait(
        self,
        event_id: uuid.UUID,
        timeout: float,
        expected: asyncio.Future[Verdict] | None = None,
    ) -> Verdict:
        """The verdict of `event_id`; `LedgerUnavailable` if none within `timeout` seconds.

        `expected` is this event's registration from `expect`, made before it was appended.
        """
        await self.start()
        fut = expected
        if fut is None:
            fut = self.expect(event_id)
            self._wake.set()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(fut)
        except TimeoutError:
            raise LedgerUnavailable(
                f"no verdict for event {event_id} within {seconds(timeout)}: the projector, "
                "Kafka or PostgreSQL is down or behind (is a `toolledger projector` running "
                "against this ledger?)"
            ) from None
        finally:
            self.discard(event_id, fut)

    async def _loop(self) -> None:
        quiet = 0  # ticks in a row with nothing pending
        while True:
            quiet = 0 if self._pending else quiet + 1
            if quiet > QUIET_TICKS:  # nothing to look for: no tick until something is pending
                self._armed.clear()
                await self._armed.wait()
                quiet = 0
            # asyncio.timeout, not wait_for: no task per wake-up, so a hint reaches the read
            # below in the loop's next turn.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            self.polls += 1
            try:
                found = await self._source.verdicts(list(self._pending))
            except database_errors() as exc:
                log.warning("reading verdicts failed (%s); retrying", exc)
                await asyncio.sleep(self._poll_interval)
                continue
            for verdict in found.values():
                self.deliver(verdict)


def carried(event_id: uuid.UUID, body: str) -> Verdict | None:
    """The verdict of `event_id` that a notification's `body` (after the event_id) carries, if
    it carries one it can be trusted to: a body that does not parse, or names another event,
    is not taken (the waiter reads the table instead)."""
    if not body:
        return None
    try:
        verdict = Verdict.model_validate_json(body)
    except ValidationError:
        log.warning("a notification for %s carries no readable verdict; reading it", event_id)
        return None
    return verdict if verdict.event_id == event_id else None


class PostgresNotifications(PostgresListener):
    """The process's one LISTEN connection for verdicts: delivers the verdicts notifications
    carry, and turns the others into waiter hints. Each one is also a commit, which `on_heard`
    hears of (the read barrier's hint, `toolledger.projections.barrier`).

    A notification for an event nobody here waits for is dropped before its verdict is
    parsed: every process listening on the ledger hears every verdict. If the connection dies
    it reconnects with backoff (`PostgresListener`) and hints every waiter, because
    notifications sent while it was down are lost.
    """

    def __init__(
        self,
        dsn: str,
        channel: str,
        waiter: VerdictWaiter,
        on_heard: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(dsn, channel, "toolledger-listen")
        self._waiter = waiter
        self._on_heard = on_heard

    def heard(self, payload: str) -> None:
        if self._on_heard is not None:
            self._on_heard()
        head, _, body = payload.partition(" ")
        try:
            event_id = uuid.UUID(head)
        except ValueError:
            self._waiter.hint()
            return
        if not self._waiter.waits_for(event_id):
            return
        verdict = carried(event_id, body)
        if verdict is None:
            self._waiter.hint(event_id)
        else:
            self._waiter.deliver(verdict)

    def missed(self) -> None:
        self._waiter.hint()
        if self._on_heard is not None:
            self._on_heard()
