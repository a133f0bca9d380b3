"""KafkaLog: the EventLog on a Kafka topic, through aiokafka.

Choices that follow from the design (docs/architecture.md, "The projector" and "Services"):

- The producer waits for `acks="all"` and is not idempotent: toolledger uses no Kafka
  transactions, dedups by event_id instead, and the local broker (tansu) fails aiokafka's
  idempotent producer. It does not linger: aiokafka keeps one request in flight per broker and
  gathers the appends made meanwhile into the next one, so concurrent appends share requests
  anyway, while a lone append is not delayed (against tansu, 0.3 ms p50 instead of 1.5 ms with
  `linger_ms=1`, for the same throughput under load).
- Readers assign partitions and seek; they have no consumer group, commit nothing and never reset
  an offset on their own (`auto_offset_reset="none"`): the projector keeps its offsets in
  PostgreSQL. Their fetches return after a few milliseconds because tansu does not wake a parked
  fetch when data arrives; a reader that finds nothing backs off to `idle_bound` seconds
  between fetches, and a hint (`LogReader.wake`) brings it back at once
  (`toolledger.events.kafka_idle`). Every append calls `on_appended` with its position, which
  is how the wiring hints the projector that owns the partition.
- Readers hand out each partition's records without holes (`Contiguous`): toolledger's topics
  are neither compacted nor written with transactions, so their offsets are contiguous, but
  tansu makes a record readable a few milliseconds after records appended after it by other
  producers (seen about once in 5,000 concurrent appends). A reader that went on past it would
  never see the record; the projector once folded a whole drill without one.
- End offsets (the read barrier's, and health's lag) are high watermarks read from a fetch
  (`toolledger.events.kafka_ends`: tansu's ListOffsets "latest" is wrong after a multi-record
  batch). Nothing's correctness rests on them, and a fetch past the end of a partition may
  return nothing instead of an error, which is why log identity rests on the epoch marker at
  offset 0 alone.
- Metadata is asked for with automatic topic creation off, and appends and readers check the
  topic exists first: brokers create a missing topic on the first request that names it (tansu
  does, and so does Kafka by default), and such a topic would have no epoch markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
    OffsetOutOfRangeError,
    for_code,
)
from aiokafka.errors import RecordTooLargeError as BrokerRecordTooLarge
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.metadata import MetadataRequest

from toolledger.events.kafka_ends import HighWatermarks
from toolledger.events.kafka_idle import IdleConsumer
from toolledger.events.log import (
    DEFAULT_MAX_RECORD_BYTES,
    EPOCH_MARKER_KEY,
    EventLog,
    LogError,
    LogIdentity,
    LogIdentityError,
    LogReader,
    LogRecord,
    Position,
    RecordTooLarge,
    TopicMissing,
    check_record_size,
    epoch_marker,
    identity_from_offset_zero,
    partition_for,
    record_size,
    topic_missing,
)
from toolledger.events.pacing import BOUND_S, IdleBackoff

_log = logging.getLogger(__name__)

_NO_ERROR = 0
_UNKNOWN_TOPIC = 3
_TOPIC_EXISTS = 36

#: The most an identity check asks for per fetch, in total and per partition. The broker still
#: returns a whole first batch when it is larger, so the marker always arrives.
IDENTITY_FETCH_BYTES = 64 * 1024


class KafkaLog(EventLog):
    """An `EventLog` on one Kafka topic.

    `replication_factor` applies to topics this log creates: 1 suits a single development broker;
    production uses 3, and then the topic also gets `min.insync.replicas=2` so an acknowledged
    append survives the loss of a broker. `identity_wait` is how long `identity` waits for a
    partition the broker reports empty to get its first record before calling it empty (a
    partition just created by another process gets its marker within milliseconds); a partition
    slow to answer is waited for up to the request timeout and never called empty. `connection`
    holds the security settings (`security_protocol`, `ssl_context`, `sasl_*`) passed to every
    aiokafka client. `max_batch_size` is the producer's batch per partition: the default
    (aiokafka's 16 KB) suits the events topic, where appends are few per request;
    a topic written in bulk (facts, published a whole batch of verdicts at a time) needs far
    larger batches, because aiokafka keeps one request in flight per broker.
    `max_record_bytes` is the producer's `max_request_size`; a record over it is refused as
    `RecordTooLarge` before it is sent (the broker's `message.max.bytes` must be at least as
    large; a broker refusing one is reported the same way). `hole_patience` is how long a
    reader waits for a missing offset while later ones are readable (`Contiguous`).
    `idle_bound` is the longest an idle reader waits between fetches (0: it never backs off).
    """

    #: Called with the position of every record this log appended (the wiring's hint).
    on_appended: Callable[[Position], None] | None = None

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        client_id: str = "toolledger",
        fetch_max_wait_ms: int = 5,
        linger_ms: int = 0,
        max_batch_size: int = 16_384,
        request_timeout_ms: int = 30_000,
        replication_factor: int = 1,
        identity_wait: float = 2.0,
        connection: Mapping[str, Any] | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        hole_patience: float = 5.0,
        idle_bound: float = BOUND_S,
    ) -> None:
        self.topic = topic
        self.idle_bound = idle_bound
        self.hole_patience = hole_patience
        self.max_record_bytes = max_record_bytes
        self._bootstrap = bootstrap
        self._client_id = client_id
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._linger_ms = linger_ms
        self._max_batch_size = max_batch_size
        self._request_timeout_ms = request_timeout_ms
        self._replication_factor = replication_factor
        self._identity_wait = identity_wait
        self._connection = dict(connection or {})
        self._metadata: AIOKafkaClient | None = None
        #: Reads offset 0 for `identity`: made on first use, kept paused between checks.
        self._identity_reader: AIOKafkaConsumer | None = None
        self._identity_lock = asyncio.Lock()
        self._producer: AIOKafkaProducer | None = None
        self._topic_seen = False
        self._topic_check = asyncio.Lock()
        self._leaders: dict[int, int] = {}
        self._ends = HighWatermarks(topic, lambda: self._started()[0], self.leaders)
        #: Records the identity checks received, for diagnostics: a check needs one per
        #: partition, and fetches are capped so it never reads much more, however long the log.
        self.identity_records_fetched = 0

    async def start(self) -> None:
        if self._producer is not None:
            return
        metadata = AIOKafkaClient(
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            request_timeout_ms=self._request_timeout_ms,
            **self._connection,
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            acks="all",
            enable_idempotence=False,
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_size,
            max_request_size=max(self._max_batch_size, self.max_record_bytes),
            request_timeout_ms=self._request_timeout_ms,
            partitioner=_partition_of,
            **self._connection,
        )
        try:
            await metadata.bootstrap()
            await producer.start()
        except KafkaError as exc:
            await producer.stop()
            await metadata.close()
            raise LogError(f"cannot connect to Kafka at {self._bootstrap}: {exc!r}") from exc
        self._metadata, self._producer = metadata, producer

    async def close(self) -> None:
        await self._drop_identity_reader()
        producer, metadata = self._producer, self._metadata
        self._producer = self._metadata = None
        if producer is not None:
            await producer.stop()
        if metadata is not None:
            await metadata.close()

    async def ensure_topic(self, partitions: int) -> LogIdentity:
        if not await self._create(partitions):
            return await self.identity()
        return await self._mark(partitions)

    async def ensure_exists(self, partitions: int) -> None:
        if await self._create(partitions):
            await self._mark(partitions)

    async def _mark(self, partitions: int) -> LogIdentity:
        """Write the epoch markers of a topic this process just created."""
        await self._await_partitions(partitions)
        identity = LogIdentity(self.topic, uuid.uuid4(), partitions)
        marker = epoch_marker(self.topic, identity.epoch, partitions)
        try:
            positions = await asyncio.gather(
                *(self._send(EPOCH_MARKER_KEY, marker, (), p) for p in range(partitions))
            )
        except LogError as exc:
            raise LogError(
                f"created {self.topic} but could not write its epoch markers ({exc}); delete the "
                "topic and run ensure_topic again before anything writes to it"
            ) from exc
        for position in positions:
            if position.offset != 0:
                raise LogIdentityError(
                    f"the epoch marker of partition {position.partition} of {self.topic} landed "
                    f"at offset {position.offset}, not 0: something appended to the topic between "
                    "its creation and its markers; delete the topic and run ensure_topic again "
                    "before any producer starts"
                )
        self._topic_seen = True
        return identity

    async def create_topic(self, partitions: int) -> bool:
        return await self._create(partitions)

    async def identity(self) -> LogIdentity:
        partitions = await self.partition_count()
        first = await self._first_records(partitions)
        return identity_from_offset_zero(self.topic, partitions, first)

    async def partition_count(self) -> int:
        partitions = await self._partitions()
        if partitions is None:
            raise TopicMissing(topic_missing(self.topic))
        return partitions

    async def append(
        self,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        hint: bool = True,
    ) -> Position:
        await self._see_topic()
        position = await self._send(key.encode(), value, headers, None)
        if hint and self.on_appended is not None:
            self.on_appended(position)
        return position

    async def append_many(
        self, records: Sequence[tuple[str, bytes]], *, hint: bool = True
    ) -> list[Position]:
        """The records built into record batches here, one per run of records bound for the
        same partition (a leader's batch is one), each handed to the producer whole and
        acknowledged with its base offset: a record's offset is the base plus its place in
        the batch, as Kafka assigns them. aiokafka's `send` per record costs about as much
        Python again as the rest of a leader's work on the record (BENCHMARKS.md, issue 46).
        Each record's partition is the one `append` gives it: Kafka's default partitioner over
        the topic's partitions as the producer's metadata knows them."""
        await self._see_topic()
        producer = self._started()[1]
        with self._failures(b"", b"", ()):
            count = len(await producer.partitions_for(self.topic))
        runs: list[tuple[int, list[int]]] = []  # (partition, places of its records)
        for place, (key, _) in enumerate(records):
            wanted = partition_for(key, count)
            if runs and runs[-1][0] == wanted:
                runs[-1][1].append(place)
            else:
                runs.append((wanted, [place]))
        sent: list[tuple[asyncio.Future[Any], list[int]]] = []
        for partition, places in runs:
            batch, in_batch = producer.create_batch(), list[int]()
            for place in places:
                key, value = records[place]
                data = key.encode()
                check_record_size(self.topic, data, value, (), self.max_record_bytes)
                if batch.append(key=data, value=value, timestamp=None) is None:  # full
                    sent.append((await self._send_batch(batch, partition), in_batch))
                    batch, in_batch = producer.create_batch(), list[int]()
                    if batch.append(key=data, value=value, timestamp=None) is None:
                        size = record_size(data, value, ())
                        raise RecordTooLarge(self.topic, key, size, self.max_record_bytes)
                in_batch.append(place)
            sent.append((await self._send_batch(batch, partition), in_batch))
        positions: list[Position | None] = [None] * len(records)
        for future, batch_places in sent:
            with self._failures(records[batch_places[0]][0].encode(), b"", ()):
                landed = await future
            for index, place in enumerate(batch_places):
                positions[place] = Position(landed.partition, landed.offset + index)
        out = [p for p in positions if p is not None]
        if hint and self.on_appended is not None:
            for position in out:
                self.on_appended(position)
        return out

    def reader(self) -> LogReader:
        return KafkaReader(self)

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]:
        """Each partition's high watermark, as a fetch response carries it (`HighWatermarks`):
        right on Apache Kafka and on tansu, whose ListOffsets is not."""
        if partitions is None:
            partitions = range(await self.partition_count())
        return await self._ends.read(partitions)

    async def leaders(self, refresh: bool = False) -> dict[int, int]:
        """The broker node leading each partition, from metadata (read again with `refresh`)."""
        if refresh or not self._leaders:
            described = await self._described()
            if described is None:
                raise TopicMissing(topic_missing(self.topic))
            self._leaders = {int(d["partition"]): int(d["leader"]) for d in described}
        return self._leaders

    async def _send_batch(self, batch: Any, partition: int) -> asyncio.Future[Any]:
        """Hand a built record batch to the producer; the future of its acknowledgement."""
        with self._failures(b"", b"", ()):
            future: asyncio.Future[Any] = await self._started()[1].send_batch(
                batch, self.topic, partition=partition
            )
        return future

    async def _see_topic(self) -> None:
        """Check once that the topic exists, before the first append creates it by accident."""
        if not self._topic_seen:
            async with self._topic_check:
                if not self._topic_seen:
                    await self.partition_count()
                    self._topic_seen = True

    async def _send(
        self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]], partition: int | None
    ) -> Position:
        producer = self._started()[1]
        check_record_size(self.topic, key, value, headers, self.max_record_bytes)
        with self._failures(key, value, headers):
            sent = await producer.send_and_wait(
                self.topic, value, key=key, partition=partition, headers=list(headers) or None
            )
        return Position(sent.partition, sent.offset)

    @contextlib.contextmanager
    def _failures(
        self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]
    ) -> Iterator[None]:
        """The producer's errors as the log's: too large (permanent), or failed (resend)."""
        try:
            yield
        except (MessageSizeTooLargeError, BrokerRecordTooLarge) as exc:
            size = record_size(key, value, headers)
            raise RecordTooLarge(
                self.topic, key.decode(errors="replace"), size, self.max_record_bytes
            ) from exc
        except KafkaError as exc:
            raise LogError(
                f"append to {self.topic} (key {key.decode(errors='replace')}) failed: {exc!r}; "
                "it may still have landed, so resend the same event (same event_id)"
            ) from exc

    async def _create(self, partitions: int) -> bool:
        configs = {"retention.ms": "-1", "cleanup.policy": "delete"}
        if self._replication_factor >= 3:
            configs["min.insync.replicas"] = "2"
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            request_timeout_ms=self._request_timeout_ms,
            **self._connection,
        )
        try:
            await admin.start()
            response = await admin.create_topics(
                [NewTopic(self.topic, partitions, self._replication_factor, topic_configs=configs)]
            )
        except KafkaError as exc:
            raise LogError(f"cannot create topic {self.topic}: {exc!r}") from exc
        finally:
            await admin.close()
        for _, code, *message in response.topic_errors:
            if code == _TOPIC_EXISTS:
                return False
            if code != _NO_ERROR:
                reason = message[0] if message and message[0] else for_code(code).__name__
                raise LogError(f"cannot create topic {self.topic}: {reason}")
        return True

    async def _partitions(self) -> int | None:
        """The topic's partition count from metadata, or None if it does not exist."""
        described = await self._described()
        return None if described is None else len(described)

    async def _described(self) -> list[dict[str, Any]] | None:
        """The topic's partitions as metadata describes them (each with its `leader`), or None
        if it does not exist.

        Asks without automatic creation; retries while the broker reports the topic as still
        being set up (a retriable error), up to the request timeout.
        """
        client = self._started()[0]
        deadline = time.monotonic() + self._request_timeout_ms / 1000
        while True:
            try:
                response = await client.send(
                    client.get_random_node(),
                    MetadataRequest([self.topic], allow_auto_topic_creation=False),
                )
            except KafkaError as exc:
                raise LogError(f"cannot read the metadata of {self.topic}: {exc!r}") from exc
            (described,) = response.to_object()["topics"]
            code = described["error_code"]
            if code == _UNKNOWN_TOPIC:
                return None
            if code == _NO_ERROR and described["partitions"]:
                return list(described["partitions"])
            error = for_code(code)
            if (code != _NO_ERROR and not error.retriable) or time.monotonic() > deadline:
                raise LogError(f"cannot read the metadata of {self.topic}: {error.__name__}")
            await asyncio.sleep(0.05)

    async def _await_partitions(self, partitions: int) -> None:
        """Wait until metadata shows all partitions of a topic just created."""
        deadline = time.monotonic() + self._request_timeout_ms / 1000
        while (await self._partitions() or 0) < partitions:
            if time.monotonic() > deadline:
                raise LogError(f"{self.topic} was created but its partitions never appeared")
            await asyncio.sleep(0.05)

    async def _first_records(self, partitions: int) -> dict[int, LogRecord | None]:
        """The record at the start of each partition, None where the broker says it is empty.

        A partition is called empty only when the broker answered that it is (high watermark 0)
        and it stayed so for `identity_wait` (a topic just created by another process gets its
        markers within milliseconds). One that did not answer, or holds records that are slow
        to come, is waited for up to the request timeout and then raises a retriable
        `LogError`: a slow broker is not a lost log.

        The consumer is kept between checks with every partition paused, so it fetches
        nothing meanwhile: a projector checks every `TOOLLEDGER_IDENTITY_CHECK_S`, and starting
        and stopping a consumer each time was most of an idle projector's CPU once its reader
        backed off. Each check assigns afresh (no state of the last one survives it); a broker
        error drops the consumer, and the next check makes a new one.
        """
        async with self._identity_lock:
            consumer = self._identity_reader
            if consumer is None:
                # Only the first record of each partition is wanted, so every fetch is capped in
                # total as well as per partition: tansu honours only the total cap (default
                # 50 MB), and without it each identity check shipped and decoded the whole topic,
                # a cost that grew with the log until a long drill's runtimes and projectors
                # starved the broker.
                consumer = self._consumer(
                    max_partition_fetch_bytes=IDENTITY_FETCH_BYTES,
                    fetch_max_bytes=IDENTITY_FETCH_BYTES,
                )
                await _start(consumer, f"cannot read offset 0 of {self.topic}")
                self._identity_reader = consumer
            try:
                return await self._read_offset_zero(consumer, partitions)
            except LogError:
                await self._drop_identity_reader()
                raise
            finally:
                if self._identity_reader is not None:
                    consumer.pause(*consumer.assignment())

    async def _drop_identity_reader(self) -> None:
        consumer, self._identity_reader = self._identity_reader, None
        if consumer is not None:
            await consumer.stop()

    async def _read_offset_zero(
        self, consumer: AIOKafkaConsumer, partitions: int
    ) -> dict[int, LogRecord | None]:
        """`_first_records` on a started consumer."""
        first: dict[int, LogRecord | None] = dict.fromkeys(range(partitions))
        unread: list[int] = []
        try:
            tps = [TopicPartition(self.topic, p) for p in range(partitions)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            started = time.monotonic()
            give_up = started + max(self._identity_wait, self._request_timeout_ms / 1000)
            while missing := [tp for tp in tps if first[tp.partition] is None]:
                now = time.monotonic()
                empty = all(consumer.highwater(tp) == 0 for tp in missing)
                if now >= give_up or (empty and now >= started + self._identity_wait):
                    break
                batch = await consumer.getmany(
                    timeout_ms=max(1, int(min(give_up - now, 0.2) * 1000))
                )
                for tp, records in batch.items():
                    self.identity_records_fetched += len(records)
                    if records and first[tp.partition] is None:
                        first[tp.partition] = _record(min(records, key=lambda r: r.offset))
                        consumer.pause(tp)
            unread = [
                tp.partition
                for tp in tps
                if first[tp.partition] is None and consumer.highwater(tp) != 0
            ]
        except OffsetOutOfRangeError as exc:
            raise LogIdentityError(
                f"{self.topic} no longer has offset 0 ({exc}): the beginning of the log, where "
                "the epoch markers were, has been deleted (retention or delete-records); the "
                "ledger in PostgreSQL is intact; restore the topic, or start a new ledger schema "
                "and replay into it"
            ) from exc
        except KafkaError as exc:
            raise LogError(f"cannot read offset 0 of {self.topic}: {exc!r}") from exc
        if unread:
            raise LogError(
                f"offset 0 of {self.topic} partitions {unread} did not arrive within "
                f"{self._request_timeout_ms / 1000:g}s, and the broker did not report them empty: "
                "it is slow or unreachable, which says nothing about lost data"
            )
        return first

    def _consumer(self, **overrides: Any) -> AIOKafkaConsumer:
        settings: dict[str, Any] = {
            "bootstrap_servers": self._bootstrap,
            "client_id": self._client_id,
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "none",
            "fetch_max_wait_ms": self._fetch_max_wait_ms,
            "request_timeout_ms": self._request_timeout_ms,
            **self._connection,
            **overrides,
        }
        return AIOKafkaConsumer(**settings)

    async def _started_consumer(self, doing: str) -> AIOKafkaConsumer:
        """A started `_consumer()`; one that cannot start is stopped and reported as
        `LogError("cannot <doing> <topic>: ...")`."""
        consumer = self._consumer()
        await _start(consumer, f"cannot {doing} {self.topic}")
        return consumer

    def _started(self) -> tuple[AIOKafkaClient, AIOKafkaProducer]:
        if self._metadata is None or self._producer is None:
            raise LogError(f"the KafkaLog of {self.topic} is not started: await start() first")
        return self._metadata, self._producer


async def _start(consumer: AIOKafkaConsumer, failure: str) -> None:
    """Start `consumer`, or stop it and raise: a consumer whose start failed or was cancelled
    (a stack closing cancels its health task mid-start) is closed, never left to the collector
    (aiokafka warns of an unclosed consumer there). A broker error is `LogError(failure: ...)`."""
    try:
        await consumer.start()
    except BaseException as exc:
        await asyncio.shield(consumer.stop())
        if isinstance(exc, KafkaError):
            raise LogError(f"{failure}: {exc!r}") from exc
        raise


def _record(record: Any) -> LogRecord:
    return LogRecord(
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value if record.value is not None else b"",
        timestamp_ms=record.timestamp,
        headers=tuple(record.headers),
    )


def _partition_of(key: bytes | None, partitions: list[int], available: list[int]) -> int:
    """The producer's partitioner: Kafka's default (murmur2 of the key), as `partition_for`
    computes it and remembers it per key, rather than aiokafka's own murmur2 on every send."""
    if key is None:  # toolledger keys every record; aiokafka's rule, for anything else
        return int(DefaultPartitioner()(key, partitions, available))
    return partitions[partition_for(key.decode(), len(partitions))]


class Contiguous:
    """Each assigned partition's next offset, so a reader hands out its records without holes.

    `take` cuts a partition's fetched records at the first missing offset and says where to
    read again: a record the broker has assigned but not yet shown (the module's docstring says
    which broker does this). A hole still open after `patience` seconds is handed over as it
    is, with a warning: a compacted or transactional topic has holes that never fill, and the
    projector and replay then halt before it (`toolledger.projections.decoding`) rather than
    fold around a missing event.
    """

    def __init__(self, patience: float) -> None:
        self.patience = patience
        self._next: dict[int, int] = {}
        self._open: dict[int, tuple[int, float]] = {}

    def start(self, positions: Mapping[int, int]) -> None:
        """Reading starts at `positions` (after an assign and seek)."""
        self._next = dict(positions)
        self._open.clear()

    def take(
        self, partition: int, records: Sequence[LogRecord], now: float
    ) -> tuple[list[LogRecord], int | None]:
        """The records to hand out, and the offset to read `partition` from again if cut."""
        expected = self._next.get(partition)
        if expected is None:
            return list(records), None
        kept: list[LogRecord] = []
        for record in records:
            if record.offset < expected:
                continue
            if record.offset > expected and not self._waited_out(partition, expected, now):
                self._next[partition] = expected
                return kept, expected
            kept.append(record)
            expected = record.offset + 1
        self._next[partition] = expected
        return kept, None

    def skip(self, partition: int, offset: int) -> bool:
        """Read `partition` from `offset` on if that is further: whether it was."""
        expected = self._next.get(partition)
        if expected is None or offset <= expected:
            return False
        self._next[partition] = offset
        self._open.pop(partition, None)
        return True

    def _waited_out(self, partition: int, missing: int, now: float) -> bool:
        since = self._open.get(partition)
        if since is None or since[0] != missing:
            self._open[partition] = (missing, now)
            return False
        if now - since[1] < self.patience:
            return False
        del self._open[partition]
        _log.warning(
            "partition %d offset %d stayed missing for %.0fs while later offsets were readable; "
            "reading on past it",
            partition,
            missing,
            now - since[1],
        )
        return True


class KafkaReader(LogReader):
    """Reads assigned partitions of a `KafkaLog`'s topic with a group-less consumer, each
    partition's records in offset order without holes (`Contiguous`)."""

    def __init__(self, log: KafkaLog) -> None:
        self._log = log
        self._consumer: IdleConsumer | None = None
        self._assigned = False
        self._contiguous = Contiguous(log.hole_patience)
        self.backoff = IdleBackoff(log.idle_bound)

    def wake(self) -> None:
        if self._consumer is not None:
            self._consumer.wake()

    @property
    def waits(self) -> int:
        """Fetches this reader's consumer let through after an idle wait (for tests)."""
        return 0 if self._consumer is None else self._consumer.waits

    def park(self, partitions: Collection[int]) -> None:
        if self._consumer is not None:
            topic = self._log.topic
            self._consumer.park({TopicPartition(topic, p) for p in partitions})

    def skip(self, partition: int, offset: int) -> None:
        if self._consumer is not None and self._contiguous.skip(partition, offset):
            # aiokafka drops fetched records, and answers in flight, from the old position
            self._consumer.consumer.seek(TopicPartition(self._log.topic, partition), offset)

    async def assign(self, positions: Mapping[int, int]) -> None:
        topic = self._log.topic
        partitions = await self._log.partition_count()
        for partition, offset in positions.items():
            if not 0 <= partition < partitions:
                raise LogError(
                    f"partition {partition} of {topic} does not exist (it has {partitions})"
                )
            if offset < 0:
                raise LogError(f"cannot read partition {partition} from offset {offset}")
        if not positions:
            # aiokafka's consumer.stop() can hang after assign([]) (seen against tansu): a reader
            # with nothing to read drops its consumer instead and makes a new one when needed.
            await self.close()
            self._assigned = False
            return
        if self._consumer is None:
            consumer = await self._log._started_consumer("start a reader of")
            self._consumer = IdleConsumer(consumer, self.backoff)
        tps = {p: TopicPartition(topic, p) for p in positions}
        self._consumer.consumer.assign(list(tps.values()))
        for partition, offset in positions.items():
            self._consumer.consumer.seek(tps[partition], offset)
        self._consumer.restart()
        self._contiguous.start(positions)
        self._assigned = bool(tps)

    async def fetch(self, max_wait: float, max_records: int = 10_000) -> dict[int, list[LogRecord]]:
        if self._consumer is None or not self._assigned:
            await asyncio.sleep(max_wait)
            return {}
        try:
            batch = await self._consumer.getmany(
                timeout_ms=int(max_wait * 1000), max_records=max_records
            )
        except OffsetOutOfRangeError as exc:
            raise LogError(
                f"{self._log.topic}: an assigned offset is out of range ({exc}); the broker no "
                "longer has it, check the log identity before reading on"
            ) from exc
        except KafkaError as exc:
            raise LogError(f"cannot read {self._log.topic}: {exc!r}") from exc
        now = time.monotonic()
        out: dict[int, list[LogRecord]] = {}
        cut = False
        for tp, records in batch.items():
            kept, again = self._contiguous.take(tp.partition, [_record(r) for r in records], now)
            if again is not None:
                self._consumer.consumer.seek(tp, again)
                cut = True
            if kept:
                out[tp.partition] = kept
        if cut and not out:
            await asyncio.sleep(0.002)  # the missing record is readable within milliseconds
        return out

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.consumer.stop()
