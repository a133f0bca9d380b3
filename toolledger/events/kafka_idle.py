"""An aiokafka consumer that stops asking the broker while nothing comes, and a hint to wake it.

aiokafka fetches in a background task of its own, not when `getmany` is called: as long as a
partition is assigned and not paused, it sends the next fetch the moment the last one returns.
Against the local broker, which parks each fetch for the consumer's `fetch_max_wait_ms` (5 ms)
and wakes none early, that is about 200 requests a second per reader, forever. So backing off
is not a matter of calling `getmany` less often: `IdleConsumer` pauses the consumer's
partitions while `IdleBackoff` says to wait, and resumes them for each fetch it lets through.
A fetch in flight when the partitions pause is not lost: its records stay buffered in the
consumer and the next fetch returns them.

Partitions can also be parked (`park`): left paused whatever the backoff says, because their
records reach the reader's caller another way (a leader's own appends, handed to its projector).

`wake()` is the hint: a wait in progress ends at once and the reader fetches as if records were
flowing (which they are about to: whoever hints has just appended). Hints come from the same
process (the leader appends, then wakes its projector's reader) or through PostgreSQL from
another (`toolledger.projections.hints`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from toolledger.events.pacing import IdleBackoff

#: A fetch after a wait gets at least this many ms, enough for the broker to answer one fetch
#: sent when the partitions resume (its parked wait included): the records that were waited for
#: arrive in this fetch, not in the one after the next wait.
RESUMED_WAIT_MS = 10


class IdleConsumer:
    """`getmany` on `consumer`, paced by `backoff`: see the module docstring."""

    def __init__(self, consumer: AIOKafkaConsumer, backoff: IdleBackoff) -> None:
        self.consumer = consumer
        self.backoff = backoff
        self._hint = asyncio.Event()
        self._paused = False
        self._parked: set[TopicPartition] = set()
        #: Fetches let through after a wait (tests wait for one to know where the cycle is).
        self.waits = 0

    def wake(self) -> None:
        """Records may be readable now: end a wait in progress, and fetch at once again."""
        self._hint.set()

    def restart(self) -> None:
        """The assignment changed: read at once (a new assignment starts unpaused and parks
        nothing)."""
        self._paused = False
        self._parked = set()
        self.backoff.active(time.monotonic())

    def park(self, partitions: set[TopicPartition]) -> None:
        """Fetch none of `partitions` until parked again without them (see the module)."""
        if partitions != self._parked:
            self._parked = partitions
            self._apply()

    async def getmany(
        self, timeout_ms: int, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]:
        """As `AIOKafkaConsumer.getmany`, but after the wait `backoff` asks for, unless woken."""
        if self.backoff.delay:
            await self._wait(self.backoff.delay)
            timeout_ms = max(timeout_ms, RESUMED_WAIT_MS)
        elif self._hint.is_set():
            self._hint.clear()
        batch: dict[TopicPartition, list[Any]] = await self.consumer.getmany(
            timeout_ms=timeout_ms, max_records=max_records
        )
        now = time.monotonic()
        if any(batch.values()):
            self.backoff.active(now)
        else:
            self.backoff.found_nothing(now)
        self._pause(bool(self.backoff.delay))
        return batch

    async def _wait(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._hint.wait()
        if self._hint.is_set():
            self._hint.clear()
            self.backoff.active(time.monotonic())
        self.waits += 1
        self._pause(False)

    def _pause(self, paused: bool) -> None:
        if paused != self._paused:
            self._paused = paused
            self._apply()

    def _apply(self) -> None:
        assigned = self.consumer.assignment()
        paused = assigned if self._paused else assigned & self._parked
        if paused:
            self.consumer.pause(*paused)
        if assigned - paused:
            self.consumer.resume(*(assigned - paused))
