"""MemoryLog: the EventLog in this process, the embedded default and the twin of Kafka in tests.

It keeps the promises of the port the way Kafka does, not more loosely: records of a key go to
`partition_for(key, n)` (Kafka's default partitioner), offsets start at 0 with the epoch marker,
a topic that nobody created cannot be appended to or read, and a reader waits for new records
instead of returning at once. Code that works against it therefore fails against Kafka only for
reasons of the network, which the contract suite covers.

Topics live in a `MemoryBroker`. Logs of one topic name on the same broker share its records, like
several Kafka clients of one cluster; each `MemoryLog` made without a broker gets a private one.
Nothing is kept across processes: "durable" here means "appended to a list".
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection, Mapping, Sequence

from toolledger.events.log import (
    DEFAULT_MAX_RECORD_BYTES,
    EPOCH_MARKER_KEY,
    EventLog,
    LogError,
    LogIdentity,
    LogReader,
    LogRecord,
    Position,
    TopicMissing,
    check_record_size,
    epoch_marker,
    identity_from_offset_zero,
    partition_for,
    topic_missing,
)


class _Topic:
    """The partitions of one topic and the readers waiting for their next record.

    Waiters are futures created by each `fetch` in its running loop, not a Condition bound to the
    loop that first used it, so a broker outlives an event loop (pytest gives each test a fresh
    one). All users must be on one thread.
    """

    def __init__(self, name: str, partitions: int) -> None:
        self.name = name
        self.partitions: list[list[LogRecord]] = [[] for _ in range(partitions)]
        self._waiters: set[asyncio.Future[None]] = set()

    def append(
        self, partition: int, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]
    ) -> Position:
        log = self.partitions[partition]
        log.append(
            LogRecord(
                partition=partition,
                offset=len(log),
                key=key,
                value=value,
                timestamp_ms=time.time_ns() // 1_000_000,
                headers=tuple(headers),
            )
        )
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()
        return Position(partition, len(log) - 1)

    def waiter(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        return future

    def forget(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)


class MemoryBroker:
    """The topics of one in-process "cluster", shared by every log and reader made from it."""

    def __init__(self) -> None:
        self._topics: dict[str, _Topic] = {}

    def log(self, topic: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> MemoryLog:
        """A log of `topic` on this broker (the topic need not exist yet)."""
        return MemoryLog(topic, broker=self, max_record_bytes=max_record_bytes)

    def _get(self, name: str) -> _Topic | None:
        return self._topics.get(name)

    def _create(self, name: str, partitions: int) -> _Topic | None:
        """The new topic, or None if one of that name exists."""
        if partitions < 1:
            raise LogError(f"cannot create {name} with {partitions} partitions: it needs 1 or more")
        if name in self._topics:
            return None
        topic = self._topics[name] = _Topic(name, partitions)
        return topic


class MemoryLog(EventLog):
    """An `EventLog` held in memory.

    `partitions`, if given, creates the topic with its epoch markers at once (what `await
    ensure_topic(partitions)` does), so a demo or a unit test can set a log up without awaiting.
    `max_record_bytes` is the same limit a Kafka producer has (its `max_request_size`), so a
    record too large for Kafka is refused here too, and a test on memory catches it.
    """

    def __init__(
        self,
        topic: str,
        partitions: int | None = None,
        *,
        broker: MemoryBroker | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self.topic = topic
        self.max_record_bytes = max_record_bytes
        self.broker = broker if broker is not None else MemoryBroker()
        self._partition_of: dict[str, int] = {}
        if partitions is not None:
            self._ensure(partitions)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def ensure_topic(self, partitions: int) -> LogIdentity:
        return self._ensure(partitions)

    def _ensure(self, partitions: int) -> LogIdentity:
        return self._create_marked(partitions) or self._identity()

    async def ensure_exists(self, partitions: int) -> None:
        self._create_marked(partitions)

    def _create_marked(self, partitions: int) -> LogIdentity | None:
        """The new identity if this call created the topic (with its markers), else None."""
        topic = self.broker._create(self.topic, partitions)
        if topic is None:
            return None
        identity = LogIdentity(self.topic, uuid.uuid4(), partitions)
        marker = epoch_marker(self.topic, identity.epoch, partitions)
        for partition in range(partitions):
            topic.append(partition, EPOCH_MARKER_KEY, marker, ())
        return identity

    async def create_topic(self, partitions: int) -> bool:
        return self.broker._create(self.topic, partitions) is not None

    async def identity(self) -> LogIdentity:
        return self._identity()

    def _identity(self) -> LogIdentity:
        topic = self._existing()
        first = {p: (records[0] if records else None) for p, records in enumerate(topic.partitions)}
        return identity_from_offset_zero(self.topic, len(topic.partitions), first)

    async def partition_count(self) -> int:
        return len(self._existing().partitions)

    async def append(
        self,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        hint: bool = True,
    ) -> Position:
        topic = self._existing()  # a memory reader is woken by the append itself: no hints
        encoded = key.encode()
        check_record_size(self.topic, encoded, value, headers, self.max_record_bytes)
        return topic.append(self._partition(key, len(topic.partitions)), encoded, value, headers)

    def _partition(self, key: str, partitions: int) -> int:
        """`partition_for` (pure-Python murmur2), remembered per key: a run appends many times.
        Keyed by the count too, although a topic's never changes."""
        found = self._partition_of.get(key)
        if found is None or found >= partitions:
            if len(self._partition_of) >= 100_000:
                self._partition_of.clear()
            found = self._partition_of[key] = partition_for(key, partitions)
        return found

    def reader(self) -> LogReader:
        return MemoryReader(self.broker, self.topic)

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]:
        logs = self._existing().partitions
        wanted = range(len(logs)) if partitions is None else partitions
        return {p: len(logs[p]) for p in wanted}

    def _existing(self) -> _Topic:
        topic = self.broker._get(self.topic)
        if topic is None:
            raise TopicMissing(topic_missing(self.topic))
        return topic


class MemoryReader(LogReader):
    """Reads a `MemoryLog` topic from given offsets, waking as soon as a record is appended.

    A fetch that waits is woken by the next append or by the reader's alarm, whichever comes
    first. The alarm is one timer per reader, left set when records wake a fetch and reused by
    the next fetch if it rings no later than that fetch's deadline: a timer armed and cancelled
    per fetch cost the embedded projector more than reading did (each is a heap entry, and the
    heap is full of every call's cancelled timeouts; BENCHMARKS.md, "the event path's own CPU").
    A fetch woken early by the alarm set for another finds nothing and waits again.
    """

    def __init__(self, broker: MemoryBroker, topic: str) -> None:
        self._broker = broker
        self._topic = topic
        self._positions: dict[int, int] = {}
        self._parked: frozenset[int] = frozenset()
        self._turn = 0
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def assign(self, positions: Mapping[int, int]) -> None:
        topic = self._broker._get(self._topic)
        if topic is None:
            raise TopicMissing(topic_missing(self._topic))
        for partition, offset in positions.items():
            if not 0 <= partition < len(topic.partitions):
                raise LogError(
                    f"partition {partition} of {self._topic} does not exist "
                    f"(it has {len(topic.partitions)})"
                )
            if offset < 0:
                raise LogError(f"cannot read partition {partition} from offset {offset}")
        self._positions = dict(positions)
        self._parked = frozenset()

    async def fetch(self, max_wait: float, max_records: int = 10_000) -> dict[int, list[LogRecord]]:
        topic = self._broker._get(self._topic)
        if topic is None or not self._positions:
            await asyncio.sleep(max_wait)
            return {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait
        while not (found := self._take(topic, max_records)):
            if loop.time() >= deadline:
                return {}
            self._alarm_by(loop, deadline)
            self._waiter = waiter = topic.waiter()
            try:
                await waiter
            finally:
                self._waiter = None
                topic.forget(waiter)
        return found

    def _alarm_by(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """An alarm that rings no later than `deadline`: the one already set if it does."""
        alarm = self._alarm
        if alarm is not None and self._alarm_loop is loop and alarm.when() <= deadline:
            return
        if alarm is not None:
            alarm.cancel()
        self._alarm = loop.call_at(deadline, self._ring)
        self._alarm_loop = loop

    def _ring(self) -> None:
        self._alarm = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def park(self, partitions: Collection[int]) -> None:
        self._parked = frozenset(partitions)

    def skip(self, partition: int, offset: int) -> None:
        if offset > self._positions.get(partition, offset):
            self._positions[partition] = offset

    def _take(self, topic: _Topic, max_records: int) -> dict[int, list[LogRecord]]:
        """Up to `max_records` new records, starting at a different partition each call so a busy
        partition cannot starve the others; none of a parked partition."""
        order = sorted(p for p in self._positions if p not in self._parked)
        if not order:
            return {}
        self._turn = (self._turn + 1) % len(order)
        found: dict[int, list[LogRecord]] = {}
        room = max_records
        for partition in order[self._turn :] + order[: self._turn]:
            if room <= 0:
                break
            start = self._positions[partition]
            records = topic.partitions[partition][start : start + room]
            if records:
                found[partition] = records
                self._positions[partition] = start + len(records)
                room -= len(records)
        return found

    async def close(self) -> None:
        self._positions = {}
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
