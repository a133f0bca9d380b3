"""Hints that records were appended, so a backed-off projector reads them at once.

A projector's reader that found nothing for a while waits up to its idle bound between fetches
(`toolledger.events.pacing`: the local broker wakes no parked fetch, so readers poll, and an
idle stack must not). Whoever appends to the events topic knows better than any poll when there
is something to read, so each append is followed by a hint to the partition's owner
(`KafkaLog.on_appended` calls `AppendHints.appended`). A hint names each partition with the
offset its record ends before (`{partition: offset + 1}`): a partition the projector does not
fetch because its leader hands the records over (`toolledger.projections.carried`) is then
fetched exactly that far, not tailed.

- **In the same process**, the projector's reader is woken directly (`local`).
- **From another process** (a runtime on the direct path, the API, a processor): a
  `pg_notify` on the schema's hint channel, the payload `partition:end` pairs separated by
  commas, sent on the process's LISTEN connection. Projectors LISTEN on that channel alone
  (`HintListener`), never on the verdicts' (each verdict would wake them for nothing), and
  wake their reader when they own a partition named. A payload of bare partition numbers
  (older writers) names no end; the projector then checks the partition's end offset.

A hint leaves after Kafka acknowledged the record, so the record is readable when the hint
arrives and the woken reader's first fetch returns it. Each process sends at most one hint per
partition per `HINT_QUIET_S`: the first append after a quiet period is hinted at once, and the
appends made during the period after it are hinted together when it ends, with the last end,
so under load the projector hears at most a few hundred hints a second per partition, not one
per call, and the last append is always hinted. Nothing depends on a hint: a lost one
(PostgreSQL down, the listener reconnecting, a writer that sends none) costs at most the
reader's idle bound before the record is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from toolledger.events.log import Position
from toolledger.projections.dberrors import database_errors
from toolledger.projections.listening import PostgresListener, channel_for, stop_task

log = logging.getLogger("toolledger.hints")

#: Seconds after a hint for a partition in which this process sends no other for it; the
#: appends made meanwhile are hinted together when it ends. Short, since a hint is how a
#: foreign record on a partition whose leader hands its own records over gets read at once
#: (`toolledger.projections.carried`): at 0.1 s a serial writer on the direct path waited for
#: the next quiet period before its outcome was read, and its step took 58-99 ms against 6 ms
#: on partitions no leader carried. One notification in flight at a time still coalesces the
#: appends of a busy process, and this still caps it at 500 hints a second per partition.
HINT_QUIET_S = 0.002

#: Sends one hint's payload (`PostgresListener.notify` on the hint channel).
Notify = Callable[[str], Awaitable[None]]
#: Wakes this process's projector for these partitions, each with the offset its records end
#: before (None: unknown); None for every partition (hints may have been lost). Says whether
#: it owns any of them, in which case no other process needs to hear of it.
Wake = Callable[[Mapping[int, int | None] | None], bool]


def hint_channel_for(schema: str) -> str:
    """The channel a schema's appends are hinted on."""
    return channel_for("a", schema)


class AppendHints:
    """Tells the owner of a partition that a record was appended to it (module docstring)."""

    def __init__(
        self,
        notify: Notify | None,
        local: Wake | None = None,
        *,
        quiet: float = HINT_QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._notify = notify
        self._local = local
        self._quiet = quiet
        self._clock = clock
        self._last: dict[int, float] = {}
        #: Per partition, the end of what was appended and not yet hinted.
        self._pending: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        #: Hints sent to other processes, for tests and diagnostics.
        self.sent = 0

    def appended(self, position: Position) -> None:
        partition, end = position.partition, position.offset + 1
        if self._local is not None and self._local({partition: end}):
            return
        if self._notify is None:
            return
        if end > self._pending.get(partition, 0):
            self._pending[partition] = end
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send(self._notify), name="toolledger-hints")

    async def _send(self, notify: Notify) -> None:
        """One notification at a time on the connection, carrying every partition whose quiet
        period is over; then, if some wait for theirs, a sleep until the first one's ends."""
        while self._pending:
            now = self._clock()
            due = {p: e for p, e in self._pending.items() if self._quiet_over(p, now)}
            if not due:
                await asyncio.sleep(min(self._last[p] for p in self._pending) + self._quiet - now)
                continue
            for partition in due:
                del self._pending[partition]
                self._last[partition] = now
            try:
                await notify(",".join(f"{p}:{e}" for p, e in sorted(due.items())))
                self.sent += 1
            except database_errors() as exc:  # the reader's bound covers a lost hint
                log.debug("could not hint appends to partitions %s (%s)", sorted(due), exc)
                for partition in due:
                    self._last.pop(partition, None)

    def _quiet_over(self, partition: int, now: float) -> bool:
        last = self._last.get(partition)
        return last is None or now - last >= self._quiet

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
        self._wake(parse_hint(payload))

    def missed(self) -> None:
        self._wake(None)


def parse_hint(payload: str) -> dict[int, int | None] | None:
    """A hint's partitions with their ends (`partition:end`, or a bare partition: no end);
    None, meaning any partition, for a payload that is neither."""
    ends: dict[int, int | None] = {}
    try:
        for part in payload.split(","):
            partition, _, end = part.partition(":")
            ends[int(partition)] = int(end) if end else None
    except ValueError:
        return None
    return ends
