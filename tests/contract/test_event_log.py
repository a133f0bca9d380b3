"""The EventLog contract: one suite, run against MemoryLog and against a real Kafka broker.

Each case is a promise the projector or the runtime relies on; the memory twin must keep it as
strictly as Kafka does, or code tested against memory breaks on Kafka.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from toolledger.devstack import delete_topics
from toolledger.events.kafka import KafkaLog
from toolledger.events.log import (
    EPOCH_MARKER_KEY,
    RECORD_OVERHEAD_BYTES,
    EventLog,
    LogError,
    LogIdentity,
    LogIdentityError,
    LogReader,
    LogRecord,
    RecordTooLarge,
    epoch_marker,
    identity_from_offset_zero,
    parse_epoch_marker,
    partition_for,
)
from toolledger.events.memory import MemoryBroker, MemoryLog


class Logs:
    """Opens logs and readers for one test and closes them all afterwards."""

    def __init__(self, new_log: Callable[[str], EventLog], prefix: str) -> None:
        self._new_log = new_log
        self._prefix = prefix
        self._opened: list[EventLog | LogReader] = []

    async def open(self, name: str = "events") -> EventLog:
        log = self._new_log(f"{self._prefix}.{name}")
        await log.start()
        self._opened.append(log)
        return log

    async def reader(self, log: EventLog, positions: Mapping[int, int]) -> LogReader:
        reader = log.reader()
        self._opened.append(reader)
        await reader.assign(positions)
        return reader

    async def close(self) -> None:
        for opened in reversed(self._opened):
            await opened.close()


async def read(reader: LogReader, count: int, within: float = 5.0) -> dict[int, list[LogRecord]]:
    """Exactly `count` records (failing on fewer within `within` s, or on any more after them)."""
    found: dict[int, list[LogRecord]] = {}
    deadline = time.monotonic() + within
    while sum(map(len, found.values())) < count:
        assert time.monotonic() < deadline, f"read {found} before the timeout, wanted {count}"
        for partition, records in (await reader.fetch(0.1)).items():
            found.setdefault(partition, []).extend(records)
    assert sum(map(len, found.values())) == count, found
    assert await reader.fetch(0.2) == {}
    return found


def key_in(partition: int, partitions: int) -> str:
    """A run id whose records land in `partition`."""
    return next(
        key for i in range(10_000) if partition_for(key := f"run-{i}", partitions) == partition
    )


class EventLogTestCase(ABC):
    """The cases every EventLog adapter must pass; subclasses say how to make a log."""

    @abstractmethod
    def new_log(self, topic: str) -> EventLog:
        """A log of `topic`, sharing records with every other log of that topic in this test."""

    @pytest.fixture
    async def logs(self, topic_prefix: str) -> AsyncIterator[Logs]:
        logs = Logs(self.new_log, topic_prefix)
        yield logs
        await logs.close()

    async def test_ensure_topic_writes_one_marker_per_partition_at_offset_zero(
        self, logs: Logs
    ) -> None:
        log = await logs.open()
        identity = await log.ensure_topic(3)

        assert identity.topic == log.topic
        assert identity.partitions == 3
        assert await log.partition_count() == 3
        assert await log.identity() == identity
        found = await read(await logs.reader(log, dict.fromkeys(range(3), 0)), 3)
        for partition in range(3):
            (marker,) = found[partition]
            assert (marker.offset, marker.key) == (0, EPOCH_MARKER_KEY)
            assert parse_epoch_marker(marker) == identity

    async def test_ensure_topic_on_an_existing_topic_returns_its_identity_without_a_new_marker(
        self, logs: Logs
    ) -> None:
        """A second process setting the topic up must not write a second epoch at offset 1."""
        first = await (await logs.open()).ensure_topic(3)
        other = await logs.open()

        assert await other.ensure_topic(3) == first
        assert await other.ensure_topic(5) == first
        await read(await logs.reader(other, dict.fromkeys(range(3), 0)), 3)

    async def test_two_processes_setting_the_topic_up_at_once_agree_on_one_identity(
        self, logs: Logs
    ) -> None:
        """The one that finds the topic created must wait for the creator's markers, not report
        the topic as markerless while they are being written."""
        one, other = await logs.open(), await logs.open()

        identities = await asyncio.gather(one.ensure_topic(3), other.ensure_topic(3))

        assert identities[0] == identities[1]
        await read(await logs.reader(one, dict.fromkeys(range(3), 0)), 3)

    async def test_appends_with_one_key_land_in_one_partition_in_order(self, logs: Logs) -> None:
        log = await logs.open()
        await log.ensure_topic(4)

        positions = [await log.append("run-a", f"{i}".encode()) for i in range(20)]

        partition = partition_for("run-a", 4)
        assert {p.partition for p in positions} == {partition}
        assert [p.offset for p in positions] == list(range(1, 21))
        found = await read(await logs.reader(log, {partition: 1}), 20)
        assert [r.value for r in found[partition]] == [f"{i}".encode() for i in range(20)]
        assert [r.offset for r in found[partition]] == list(range(1, 21))

    async def test_a_reader_from_a_stored_offset_returns_exactly_the_records_from_there(
        self, logs: Logs
    ) -> None:
        """The projector resumes at its stored next offset: nothing before it, nothing skipped."""
        log = await logs.open()
        await log.ensure_topic(2)
        positions = [await log.append("run-b", f"{i}".encode()) for i in range(10)]
        stored = positions[6]

        found = await read(await logs.reader(log, {stored.partition: stored.offset}), 4)

        records = found[stored.partition]
        assert [r.value for r in records] == [b"6", b"7", b"8", b"9"]
        assert [r.offset for r in records] == [p.offset for p in positions[6:]]
        assert all(r.key == b"run-b" for r in records)

    async def test_a_fetch_with_nothing_new_returns_empty_within_max_wait(self, logs: Logs) -> None:
        log = await logs.open()
        await log.ensure_topic(1)
        reader = await logs.reader(log, {0: 1})

        started = time.monotonic()
        assert await reader.fetch(0.3) == {}
        assert time.monotonic() - started < 1.0

    async def test_a_waiting_fetch_returns_a_new_record_promptly(self, logs: Logs) -> None:
        """A fetch parked on an idle partition must return soon after a record is appended, not
        when its wait ends (tansu does not wake parked fetches, so with a long broker-side fetch
        wait the projector would lag by it at every quiet moment)."""
        log = await logs.open()
        await log.ensure_topic(1)
        reader = await logs.reader(log, {0: 1})
        lags: list[float] = []

        async def append_soon(i: int) -> float:
            await asyncio.sleep(0.05)
            await log.append("run-c", f"{i}".encode())
            return time.monotonic()

        for i in range(5):
            fetched, appended = await asyncio.gather(reader.fetch(5.0), append_soon(i))
            lags.append(time.monotonic() - appended)
            assert [r.value for r in fetched[0]] == [f"{i}".encode()]

        assert sum(lags) < 0.25, lags

    async def test_concurrent_appends_get_distinct_positions_and_are_all_read_back(
        self, logs: Logs
    ) -> None:
        log = await logs.open()
        await log.ensure_topic(3)
        keys = [f"run-{i % 7}" for i in range(200)]

        positions = await asyncio.gather(
            *(log.append(key, f"{i}".encode()) for i, key in enumerate(keys))
        )

        assert len(set(positions)) == 200
        assert all(p.partition == partition_for(k, 3) for p, k in zip(positions, keys, strict=True))
        found = await read(await logs.reader(log, dict.fromkeys(range(3), 1)), 200)
        for records in found.values():
            assert [r.offset for r in records] == list(range(1, len(records) + 1))
        at = {(r.partition, r.offset): r.value for records in found.values() for r in records}
        assert {p: at[(p.partition, p.offset)] for p in positions} == {
            p: f"{i}".encode() for i, p in enumerate(positions)
        }

    async def test_appends_made_together_land_as_one_at_a_time_would_and_say_where(
        self, logs: Logs
    ) -> None:
        """A leader proves its batch by the offsets `append_many` returns: each must be the
        offset its own record landed at (a record batch's base plus its place in it, on Kafka),
        in the partition `append` would give its key, whatever the mix of keys; one wrong
        offset and the leader folds another record's event as this one."""
        log = await logs.open()
        await log.ensure_topic(3)
        same = [(key_in(1, 3), f"a{i}".encode()) for i in range(12)]
        mixed = [(f"run-{i % 5}", f"b{i}".encode()) for i in range(15)]

        positions = await log.append_many(same) + await log.append_many(mixed)

        records = same + mixed
        assert len(set(positions)) == len(records)
        assert [p.partition for p in positions] == [partition_for(k, 3) for k, _ in records]
        assert [p.offset for p in positions[:12]] == list(range(1, 13))
        found = await read(await logs.reader(log, dict.fromkeys(range(3), 1)), len(records))
        at = {(r.partition, r.offset): (r.key, r.value) for rs in found.values() for r in rs}
        assert [at[(p.partition, p.offset)] for p in positions] == [
            (k.encode(), v) for k, v in records
        ]

    async def test_a_reader_following_several_producers_sees_every_offset_once_in_order(
        self, logs: Logs
    ) -> None:
        """The projector reads while runtimes append. A reader that skipped a record not yet
        readable (tansu shows one a few ms late about once in 5,000 concurrent appends) would
        never come back for it: the fold would miss an event for good."""
        first = await logs.open()
        await first.ensure_topic(1)
        producers = [first] + [await logs.open() for _ in range(5)]
        reader = await logs.reader(first, {0: 1})
        per_producer = 300
        total = per_producer * len(producers)

        async def produce(log: EventLog, n: int) -> None:
            for i in range(per_producer):
                await log.append("run-1", f"{n}-{i}".encode())

        appending = asyncio.ensure_future(
            asyncio.gather(*(produce(log, n) for n, log in enumerate(producers)))
        )
        offsets: list[int] = []
        quiet_since = time.monotonic()
        while not appending.done() or time.monotonic() - quiet_since < 1.0:
            for records in (await reader.fetch(0.05)).values():
                offsets += [r.offset for r in records]
                quiet_since = time.monotonic()
        await appending
        missing = sorted(set(range(1, total + 1)) - set(offsets))
        assert not missing, f"never read offsets {missing[:10]} of {total}"
        assert offsets == list(range(1, total + 1))

    async def test_identity_of_a_topic_whose_offset_zero_is_not_a_marker_raises(
        self, logs: Logs
    ) -> None:
        """A topic something else created (a broker auto-creating it on first use) must not be
        taken for a ledger's log."""
        log = await logs.open()
        assert await log.create_topic(1)
        assert (await log.append("run-d", b"ordinary")).offset == 0

        with pytest.raises(LogIdentityError, match=r"partition 0 of \S+ has no epoch marker"):
            await log.identity()
        with pytest.raises(LogIdentityError, match="ordinary record"):
            await log.ensure_topic(1)

    async def test_ensure_exists_creates_a_missing_topic_with_its_markers(self, logs: Logs) -> None:
        log = await logs.open()

        await log.ensure_exists(2)

        identity = await log.identity()
        assert identity.partitions == 2
        assert await log.ensure_topic(2) == identity

    async def test_ensure_exists_leaves_an_existing_topic_unread(self, logs: Logs) -> None:
        """What a runtime calls at each start: it neither reads nor judges offset 0 of an
        existing topic (the projector does), and it never adds a marker."""
        log = await logs.open()
        assert await log.create_topic(1)
        assert (await log.append("run-d", b"ordinary")).offset == 0

        await log.ensure_exists(1)

        assert (await log.append("run-d", b"next")).offset == 1
        with pytest.raises(LogIdentityError, match="ordinary record"):
            await log.ensure_topic(1)

    async def test_identity_of_a_topic_with_an_empty_partition_raises(self, logs: Logs) -> None:
        """A broker that lost its data (tansu after a restart) shows up as empty partitions."""
        log = await logs.open()
        assert await log.create_topic(1)

        with pytest.raises(LogIdentityError, match="the partition is empty"):
            await log.identity()

    async def test_a_reader_assigned_to_some_partitions_sees_only_those(self, logs: Logs) -> None:
        log = await logs.open()
        await log.ensure_topic(4)
        for partition in range(4):
            for i in range(3):
                await log.append(key_in(partition, 4), f"{partition}/{i}".encode())

        found = await read(await logs.reader(log, {0: 0, 2: 0}), 8)

        assert set(found) == {0, 2}
        assert [r.value for r in found[2][1:]] == [b"2/0", b"2/1", b"2/2"]

    async def test_assign_replaces_the_previous_assignment(self, logs: Logs) -> None:
        log = await logs.open()
        await log.ensure_topic(2)
        await log.append(key_in(0, 2), b"zero")
        await log.append(key_in(1, 2), b"one")
        reader = await logs.reader(log, {0: 1})
        assert [r.value for r in (await read(reader, 1))[0]] == [b"zero"]

        await reader.assign({1: 1})

        assert [r.value for r in (await read(reader, 1))[1]] == [b"one"]

    async def test_records_keep_their_key_headers_and_timestamp(self, logs: Logs) -> None:
        log = await logs.open()
        await log.ensure_topic(1)
        before = time.time() * 1000 - 60_000

        await log.append("run-e", b"v", headers=[("schema", b"\x01"), ("trace", b"t")])

        (record,) = (await read(await logs.reader(log, {0: 1}), 1))[0]
        assert record.key == b"run-e"
        assert record.headers == (("schema", b"\x01"), ("trace", b"t"))
        assert record.timestamp_ms > before
        assert not record.is_epoch_marker

    async def test_a_topic_nobody_created_is_neither_written_read_nor_created_by_using_it(
        self, logs: Logs
    ) -> None:
        """Brokers create a missing topic when a client names it; such a topic has no epoch
        markers, so the log refuses instead of using it."""
        log = await logs.open()

        with pytest.raises(LogError, match="does not exist"):
            await log.append("run-f", b"v")
        with pytest.raises(LogError, match="does not exist"):
            await log.identity()
        with pytest.raises(LogError, match="does not exist"):
            await log.reader().assign({0: 0})

        assert await log.create_topic(2)
        assert not await log.create_topic(2)
        assert await log.partition_count() == 2

    async def test_assigning_a_partition_the_topic_lacks_raises(self, logs: Logs) -> None:
        log = await logs.open()
        await log.ensure_topic(2)

        with pytest.raises(LogError, match=r"partition 2 of \S+ does not exist"):
            await logs.reader(log, {2: 0})

    async def test_an_oversized_record_is_refused_permanently_and_never_lands(
        self, logs: Logs
    ) -> None:
        """A record Kafka cannot take raised an error that read "may have landed, resend", so
        the runtime resent it forever and the call never returned."""
        log = await logs.open()
        await log.ensure_topic(2)
        limit = log.max_record_bytes
        fits = b"f" * (limit - RECORD_OVERHEAD_BYTES - len(b"run-g"))

        with pytest.raises(RecordTooLarge) as raised:
            await log.append("run-g", fits + b"!")
        assert (raised.value.size, raised.value.limit) == (len(fits) + 1 + 5, limit)
        assert "TOOLLEDGER_MAX_RECORD_BYTES" in str(raised.value)
        with pytest.raises(RecordTooLarge):
            await log.append("run-g", b"v", [("h", b"x" * limit)])
        position = await log.append("run-g", fits)
        assert position.offset == 1, "the refused records must not have landed"
        found = await read(await logs.reader(log, {position.partition: 1}), 1, within=10)
        assert found[position.partition][0].value == fits


class TestMemoryLog(EventLogTestCase):
    @pytest.fixture(autouse=True)
    def _broker(self) -> None:
        self.broker = MemoryBroker()

    def new_log(self, topic: str) -> EventLog:
        return MemoryLog(topic, broker=self.broker)

    async def test_a_log_made_with_partitions_is_ready_without_awaiting(self) -> None:
        log = MemoryLog("events", partitions=2)

        identity = await log.identity()

        assert identity.partitions == 2
        assert await log.ensure_topic(2) == identity


@pytest.mark.services
class TestKafkaLog(EventLogTestCase):
    @pytest.fixture(autouse=True)
    def _bootstrap(self, kafka_bootstrap: str) -> None:
        self.bootstrap = kafka_bootstrap

    def new_log(self, topic: str) -> EventLog:
        return KafkaLog(self.bootstrap, topic, identity_wait=0.5)

    async def test_an_identity_check_reads_a_bounded_prefix_of_a_long_log(self, logs: Logs) -> None:
        """Runtimes check the identity when they connect and projectors every few seconds: the
        check must not read the whole log (tansu ignores the per-partition fetch cap, so a check
        that relied on it downloaded and decoded every record, slower as the log grew)."""
        writer = await logs.open()
        identity = await writer.ensure_topic(2)
        body = b"x" * 1024
        appended = 0
        for chunk in range(12):
            await asyncio.gather(*(writer.append(f"run-{chunk}-{i}", body) for i in range(100)))
            appended += 100
        checker = await logs.open()
        assert isinstance(checker, KafkaLog)

        assert await checker.identity() == identity
        # Two markers wanted; each fetch is capped at 64 KB, about 60 records of this size.
        assert 2 <= checker.identity_records_fetched <= 200 < appended

    async def test_a_log_kept_between_identity_checks_sees_its_topic_made_again(
        self, logs: Logs
    ) -> None:
        """A projector checks the identity every few seconds on one consumer kept between
        checks: one that carried the last check's partitions or positions over would report
        the lost log's epoch (or wait out the timeout) after the broker lost the topic and
        somebody made it again, and the projector would fold a log that is not the ledger's."""
        writer = await logs.open()
        before = await writer.ensure_topic(2)
        checker = await logs.open()
        assert await checker.identity() == before
        assert await checker.identity() == before
        await delete_topics(self.bootstrap, writer.topic)
        again = await logs.open()
        after = await again.ensure_topic(3)
        assert after.epoch != before.epoch

        assert await checker.identity() == after


del EventLogTestCase


class TestIdentityFromOffsetZero:
    """The judgement both adapters apply to what offset 0 of each partition holds; cases no
    adapter can produce through the port (markers written by hand) are checked here."""

    topic = "toolledger.events"

    def marker(
        self, partition: int, epoch: uuid.UUID, partitions: int, topic: str = ""
    ) -> LogRecord:
        value = epoch_marker(topic or self.topic, epoch, partitions)
        return LogRecord(partition, 0, EPOCH_MARKER_KEY, value, 0)

    def test_markers_that_agree_give_the_identity(self) -> None:
        epoch = uuid.uuid4()
        first = {p: self.marker(p, epoch, 2) for p in range(2)}

        assert identity_from_offset_zero(self.topic, 2, first) == LogIdentity(self.topic, epoch, 2)

    def test_partitions_from_different_incarnations_are_detected(self) -> None:
        first = {p: self.marker(p, uuid.uuid4(), 2) for p in range(2)}

        with pytest.raises(LogIdentityError, match="different epochs"):
            identity_from_offset_zero(self.topic, 2, first)

    def test_added_partitions_are_reported_as_a_changed_partition_count(self) -> None:
        """Partitions added to the topic (empty, so without markers) move runs to other
        partitions; calling that data loss would send the operator the wrong way."""
        epoch = uuid.uuid4()
        first = {p: self.marker(p, epoch, 2) for p in range(2)}

        with pytest.raises(LogIdentityError, match="has 3 partitions but its epoch markers say 2"):
            identity_from_offset_zero(self.topic, 3, {**first, 2: None})

    def test_a_marker_of_another_topic_is_detected(self) -> None:
        first = {0: self.marker(0, uuid.uuid4(), 1, topic="elsewhere")}

        with pytest.raises(LogIdentityError, match="marker of topic elsewhere"):
            identity_from_offset_zero(self.topic, 1, first)

    def test_a_partition_whose_beginning_was_deleted_is_detected(self) -> None:
        record = LogRecord(0, 7, b"run-1", b"v", 0)

        with pytest.raises(LogIdentityError, match="starts at offset 7"):
            identity_from_offset_zero(self.topic, 1, {0: record})

    def test_an_unreadable_marker_is_detected(self) -> None:
        record = LogRecord(
            0, 0, EPOCH_MARKER_KEY, epoch_marker(self.topic, uuid.uuid4(), 1)[:-3], 0
        )

        with pytest.raises(LogIdentityError, match="unreadable epoch marker"):
            identity_from_offset_zero(self.topic, 1, {0: record})
