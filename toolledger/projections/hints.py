"""Hints that records were appended, so a backed-off projector reads them at once.

A projector's reader that found nothing for a while waits up to its idle bound between fetches
(`toolledger.events.pacing`: the local broker wakes no parked fetch, so readers poll, and an
idle stack must not). Whoever appends to the events topic knows better than any poll when there
is something to read, so each append is followed by a hint to the partition's owner
(`KafkaLog.on_appended` calls `AppendHints.appended`):

- **In the same process**, the projector's reader is woken directly (`local`): the leader
  appends only for partitions its projector owns, so the fast path needs nothing else.
- **From another process** (a runtime on the direct path, the API, a processor): a
  `pg_notify` on the schema's hint channel, the payload the partition numbers, sent on the
  process's LISTEN connection. Projectors LISTEN on that channel alone (`HintListener`),
  never on the verdicts' (each verdict would wake them for nothing), and wake their reader
  when they own a partition named.

A hint leaves after Kafka acknowledged the record, so the record is readable when the hint
arrives and the woken reader's first fetch returns it. Each process sends at most one hint per
partition per `HINT_QUIET_S`: a reader woken by a hint polls at once for at least
`IDLE_AFTER_S` after it, so while hints keep coming less than `HINT_QUIET_S` apart (well under
that, a notification's trip included) the reader is polling anyway and a hint would change
nothing; under load the projector hears a few hints a second, not one per call. Nothing
depends on a hint: a lost one (PostgreSQL down, the listener reconnecting, a writer that sends
none) costs at most the reader's idle bound before the record is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from toolledger.events.log import Position
from toolledger.projections.dberrors import database_errors
from toolledger.projections.listening import PostgresListener, channel_for, stop_task

log = logging.getLogger("toolledger.hints")

#: Seconds after a hint for a partition in which this process sends no other for it. Well
#: under `IDLE_AFTER_S`, which is how long the woken reader polls at once after the hint.
HINT_QUIET_S = 0.1

#: Sends one hint's payload (`PostgresListener.notify` on the hint channel).
Notify = Callable[[str], Awaitable[None]]
#: Wakes this process's projector for these partitions (None: whatever it owns); says whether
#: it owns any of them, in which case no other process needs to hear of it.
Wake = Callable[[Collection[int] | None], bool]


def hint_channel_for(schema: str) -> str:
    """The channel a schema's appends are hinted on."""
    return channel_for("a", schema)


class AppendHints:
    """Tells the owner of a partition that a record was appended to it (module docstring)."""

    def __init__(
        self, notify: Notify | None, local: Wake | None = None, *, quiet: float = HINT_QUIET_S
    ) -> None:
        self._notify = notify
        self._local = local
        self._quiet = quiet
        self._last: dict[int, float] = {}
        self._pending: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        #: Hints sent to other processes, for tests and diagnostics.
        self.sent = 0

    def appended(self, position: Position) -> None:
        partition = position.partition
        if self._local is not None and self._local((partition,)):
            return
        if self._notify is None:
            return
        now = time.monotonic()
        if now - self._last.get(partition, -self._quiet) < self._quiet:
            return
        self._last[partition] = now
        self._pending.add(partition)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send(self._notify), name="toolledger-hints")

    async def _send(self, notify: Notify) -> None:
        """One notification at a time on the connection, carrying every partition pending."""
        while self._pending:
            partitions = sorted(self._pending)
            self._pending.clear()
            try:
                await notify(",".join(map(str, partitions)))
                self.sent += 1
            except database_errors() as exc:  # the reader's bound covers a lost hint
                log.debug("could not hint appends to partitions %s (%s)", partitions, exc)
                for partition in partitions:
                    self._last.pop(partition, None)

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)


class HintListener(PostgresListener):
    """A projector's LISTEN on the hint channel: wakes its reader for the partitions named,
    and for all of them when hints may have been lost (a reconnect)."""

    def __init__(self, dsn: str, channel: str, wake: Wake) -> None:
        super().__init__(dsn, channel, "toolledger-hints")
        self._wake = wake
        #: Hints heard, for tests and diagnostics.
        self.heard_count = 0

    def heard(self, payload: str) -> None:
        self.heard_count += 1
        try:
            partitions: set[int] | None = {int(p) for p in payload.split(",")}
        except ValueError:
            partitions = None
        self._wake(partitions)

    def missed(self) -> None:
        self._wake(None)
