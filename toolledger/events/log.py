"""The EventLog port: an append-only, partitioned log keyed by run_id.

Adapters: `toolledger.events.kafka.KafkaLog` (aiokafka, acks=all, no transactions) and
`toolledger.events.memory.MemoryLog` (in-process, the embedded default). Both pass one contract
suite (`tests/contract/test_event_log.py`).

Log identity: when toolledger creates a topic it writes an *epoch marker* at offset 0 of every
partition: the same random UUID and the partition count. The projector stores the epoch with its
offsets and checks it on ownership, so a broker that lost its data, a recreated topic or a changed
partition count is detected instead of silently folded as a new history. End offsets are never
used for correctness. Both adapters judge what offset 0 holds with the same function
(`identity_from_offset_zero`), so the memory twin fails with the same words as Kafka.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from toolledger.errors import ToolLedgerError

EPOCH_MARKER_KEY = b"toolledger.epoch"
_EPOCH_MARKER_PREFIX = b"TLEPOCH1"


class LogError(ToolLedgerError):
    """The log cannot be used as asked (unreachable, missing topic, wrong shape)."""

    code = "log_error"


class TopicMissing(LogError):
    """The topic does not exist (never created, or the broker lost it)."""

    code = "topic_missing"


def topic_missing(topic: str) -> str:
    """What to do about a topic that is not there: the command that creates the ledger's
    topics, in the words of the people who meet it (a command line, not a Python API)."""
    return (
        f"topic {topic} does not exist: start `toolledger projector` (or `toolledger server`) "
        "once against this Kafka, it creates the ledger's topics, or check "
        "TOOLLEDGER_TOPIC_PREFIX and TOOLLEDGER_KAFKA_BOOTSTRAP"
    )


class LogIdentityError(LogError):
    """The log is not the one the ledger was built from; says what happened and what to do."""

    code = "log_identity"


#: The largest record a log takes by default: aiokafka's `max_request_size` and the broker's
#: `message.max.bytes` default, both 1 MiB.
DEFAULT_MAX_RECORD_BYTES = 1_048_576
#: Room left in `max_record_bytes` for what Kafka adds around a record (batch and record
#: headers, lengths, CRC), so a record the check lets through is never refused by the client.
RECORD_OVERHEAD_BYTES = 512


class RecordTooLarge(LogError):
    """A record over the log's size limit. Refused before it is sent, so it never landed, and
    permanent: resending the same bytes can only fail again, so nobody retries it."""

    code = "record_too_large"

    def __init__(self, topic: str, key: str, size: int, limit: int) -> None:
        super().__init__(
            f"a record of {size} bytes for key {key} is larger than {topic} accepts "
            f"({limit} bytes with Kafka's overhead, setting TOOLLEDGER_MAX_RECORD_BYTES); it was "
            "not appended. Large payloads travel by reference (docs/payloads.md): this one was "
            "not offloaded, or too many fields of one event are near the inline threshold"
        )
        self.topic = topic
        self.key = key
        self.size = size
        self.limit = limit


def record_size(key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]) -> int:
    """The bytes of a record that count against the limit: key, value and headers."""
    return len(key) + len(value) + sum(len(name.encode()) + len(data) for name, data in headers)


def check_record_size(
    topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]], limit: int
) -> None:
    """Raise `RecordTooLarge` if the record would not fit in `limit` bytes with its overhead.

    Every adapter judges sizes with this one function, so the memory log refuses exactly the
    records Kafka would.
    """
    size = record_size(key, value, headers)
    if size + RECORD_OVERHEAD_BYTES > limit:
        raise RecordTooLarge(topic, key.decode(errors="replace"), size, limit)


@dataclass(frozen=True)
class LogRecord:
    """One record as read from a partition."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def is_epoch_marker(self) -> bool:
        return self.key == EPOCH_MARKER_KEY and self.value.startswith(_EPOCH_MARKER_PREFIX)


@dataclass(frozen=True)
class Position:
    partition: int
    offset: int


@dataclass(frozen=True)
class LogIdentity:
    """What offset 0 of every partition says about the topic."""

    topic: str
    epoch: uuid.UUID
    partitions: int


def epoch_marker(topic: str, epoch: uuid.UUID, partitions: int) -> bytes:
    body = {"topic": topic, "epoch": str(epoch), "partitions": partitions}
    return _EPOCH_MARKER_PREFIX + json.dumps(body, sort_keys=True).encode()


def parse_epoch_marker(record: LogRecord) -> LogIdentity | None:
    """The identity an epoch marker holds, or None if the record is not a marker."""
    if not record.is_epoch_marker:
        return None
    body = json.loads(record.value[len(_EPOCH_MARKER_PREFIX) :])
    return LogIdentity(
        topic=str(body["topic"]), epoch=uuid.UUID(body["epoch"]), partitions=int(body["partitions"])
    )


_RECOVERY = (
    "the ledger in PostgreSQL is intact; restore the topic, or start a new ledger schema and "
    "replay into it"
)


def identity_from_offset_zero(
    topic: str, partitions: int, first: Mapping[int, LogRecord | None]
) -> LogIdentity:
    """Judge the first record of every partition (None: none could be read) as a log identity.

    Every partition must start at offset 0 with a marker of this topic, all with one epoch and a
    partition count equal to the topic's real one (`partitions`); anything else raises
    `LogIdentityError` naming the partition, what was found and what to do. A changed partition
    count is reported as such even though the added partitions also lack markers.
    """
    found: dict[int, LogIdentity] = {}
    problems: list[str] = []
    for partition in range(partitions):
        judged = _judge_offset_zero(topic, partition, first.get(partition))
        if isinstance(judged, LogIdentity):
            found[partition] = judged
        else:
            problems.append(judged)
    counts = {marker.partitions for marker in found.values()}
    if counts and counts != {partitions}:
        raise LogIdentityError(
            f"{topic} has {partitions} partitions but its epoch markers say "
            f"{', '.join(map(str, sorted(counts)))}: its partition count was changed, which moves "
            "runs to other partitions and breaks their order; never change the partition count "
            "of a ledger topic: migrate to a new topic and replay"
        )
    if problems:
        raise LogIdentityError(problems[0])
    epochs = {marker.epoch for marker in found.values()}
    if len(epochs) > 1:
        listing = ", ".join(f"partition {p}: {m.epoch}" for p, m in sorted(found.items()))
        raise LogIdentityError(
            f"the partitions of {topic} carry different epochs ({listing}): they come from "
            f"different incarnations of the topic; {_RECOVERY}"
        )
    return LogIdentity(topic=topic, epoch=epochs.pop(), partitions=partitions)


def _judge_offset_zero(topic: str, partition: int, record: LogRecord | None) -> LogIdentity | str:
    """The marker a partition starts with, or what is wrong with it."""
    where = f"partition {partition} of {topic}"
    if record is None:
        return (
            f"{where} has no epoch marker at offset 0 (the partition is empty): the broker "
            f"lost its data or the topic was recreated or auto-created; {_RECOVERY}"
        )
    if record.offset != 0:
        return (
            f"{where} starts at offset {record.offset}, not 0: its beginning, where the epoch "
            f"marker was, has been deleted (retention or delete-records); {_RECOVERY}"
        )
    try:
        marker = parse_epoch_marker(record)
    except (ValueError, KeyError, TypeError) as exc:
        return f"{where} holds an unreadable epoch marker at offset 0 ({exc}); {_RECOVERY}"
    if marker is None:
        return (
            f"{where} has no epoch marker at offset 0 (it holds an ordinary record): the topic "
            "was not created by toolledger (auto-created by the broker on first use, or created "
            "by hand); delete it and run ensure_topic before anything writes to it, or if it "
            f"held a ledger's history, {_RECOVERY}"
        )
    if marker.topic != topic:
        return (
            f"{where} holds the epoch marker of topic {marker.topic}: it was copied from another "
            f"topic, so its offsets are not the ones the ledger stored; {_RECOVERY}"
        )
    return marker


@functools.lru_cache(maxsize=1 << 16)
def partition_for(key: str, partitions: int) -> int:
    """The partition a record with this key lands in: Kafka's default partitioner (murmur2).

    Every adapter uses it, so a run lands in the same partition number in memory and on Kafka.
    Remembered per key: a run's key is asked for at every request of the run, by the runtime,
    its leader and the producer, and murmur2 in Python costs microseconds a time.
    """
    return (_murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def _murmur2(data: bytes) -> int:
    """MurmurHash2 as Kafka's Java client computes it, as an unsigned 32-bit number."""
    m, seed = 0x5BD1E995, 0x9747B28C
    h = (seed ^ len(data)) & 0xFFFFFFFF
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


class LogReader(ABC):
    """Reads assigned partitions from given offsets, in offset order per partition.

    It returns every record, epoch markers included (offset 0 of a topic made by `ensure_topic`):
    readers skip them with `LogRecord.is_epoch_marker`. It never commits offsets anywhere: the
    caller stores its position with its own data and seeks to it.
    """

    @abstractmethod
    async def assign(self, positions: Mapping[int, int]) -> None:
        """Read exactly these partitions, each from the given offset (replacing any before).

        Raises `LogError` if the topic or a partition does not exist, rather than letting a
        broker auto-create a topic without epoch markers.
        """

    @abstractmethod
    async def fetch(self, max_wait: float, max_records: int = 10_000) -> dict[int, list[LogRecord]]:
        """Records available now (waiting up to `max_wait` s for the first), by partition.

        An empty result means nothing new arrived in time, never that the log ended: an offset
        past the end just yields nothing (some brokers do not report it as out of range). A
        reader that polls its broker may wait longer than `max_wait` once it found nothing for a
        while (up to its idle bound, `toolledger.events.pacing`), unless `wake` is called.
        """

    def wake(self) -> None:  # noqa: B027 (a no-op by default: only polling readers back off)
        """A hint that records may be readable now: a reader backed off while idle fetches at
        once. Never needed for correctness, only for speed."""

    def park(self, partitions: Collection[int]) -> None:  # noqa: B027 (see below)
        """Stop fetching these assigned partitions, and fetch every other one: their records
        reach the caller another way for now (a projector takes what its leader appended and
        proved, `toolledger.projections.following`). Each call replaces the last; `assign`
        parks none. Never needed for correctness, only for speed: a no-op by default, and a
        caller must take records it already has from a fetch without harm."""

    def skip(self, partition: int, offset: int) -> None:  # noqa: B027 (see below)
        """The caller has `partition`'s records before `offset` from elsewhere: read it from
        `offset` on, if that is further than this reader has come. A no-op by default (the
        reader then hands those records out again, and the caller drops them)."""

    @abstractmethod
    async def close(self) -> None: ...


class EventLog(ABC):
    """An append-only topic.

    Promises: `append` returns only once the record is durable (Kafka: acks=all) and returns its
    position; records with the same key land in the same partition in append order; a partition's
    offsets start at 0 and only grow; nothing is ever rewritten. A record whose key, value and
    headers exceed `max_record_bytes` less `RECORD_OVERHEAD_BYTES` is refused with
    `RecordTooLarge` before anything is sent (`check_record_size`): permanent, never retried.
    """

    topic: str
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ensure_topic(self, partitions: int) -> LogIdentity:
        """Create the topic with epoch markers if it does not exist; return its identity.

        Only the call that creates the topic writes markers, so an existing topic is never given
        a second one; its identity (whose partition count may differ from the one asked for) is
        read and checked as `identity` does.
        """

    @abstractmethod
    async def ensure_exists(self, partitions: int) -> None:
        """Create the topic with epoch markers if it does not exist; an existing topic is left
        as it is, unread.

        For processes that only append (runtimes). The identity is the projector's to check, on
        ownership and every few seconds, against the one the ledger was built from; a runtime
        has nothing to compare it with, and reading offset 0 of every partition at each start
        is not free on every broker (tansu lists a partition's whole history to serve a fetch
        from offset 0).
        """

    @abstractmethod
    async def create_topic(self, partitions: int) -> bool:
        """Create the topic without epoch markers (dead letters, facts); True if this call did.

        Same retention as the ledger topic: kept forever, never compacted.
        """

    @abstractmethod
    async def identity(self) -> LogIdentity:
        """Read the epoch markers at offset 0; raise `LogIdentityError` if any is missing or
        they disagree with each other or with the partition count."""

    @abstractmethod
    async def partition_count(self) -> int: ...

    @abstractmethod
    async def append(
        self,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        hint: bool = True,
    ) -> Position:
        """Append durably; the position once acknowledged.

        `hint`: tell the partition's projector (`toolledger.projections.hints`); False when the
        appender hands the record to it itself (a leader to its own projector).

        The partition is `partition_for(key, partitions)`. Raises `RecordTooLarge` for a record
        over the size limit (it did not land; do not resend it), and `LogError` if the topic
        does not exist, or if the append failed; a failed append may still have landed, so a
        caller resends the same event (same event_id) and the projector applies it once.
        """

    async def append_many(
        self, records: Sequence[tuple[str, bytes]], *, hint: bool = True
    ) -> list[Position]:
        """`append` of each `(key, value)`, all at once (without headers): their positions, in
        order, once every one is acknowledged; `LogError` if any failed (the others may have
        landed: resend them all, with the same event_ids)."""
        return list(await asyncio.gather(*(self.append(k, v, hint=hint) for k, v in records)))

    @abstractmethod
    def reader(self) -> LogReader:
        """A new reader with no partitions assigned."""

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]:
        """The end offset of each of `partitions` (None: all): the offset after the last record
        acknowledged to any writer, so every acknowledged record lies below it.

        The read barrier waits for the projection to reach it (`toolledger.projections.barrier`),
        health reports lag with it, and a projector asks it of the partitions it does not fetch,
        to learn whether they hold records it lacks. The projection's correctness never depends
        on it (docs/architecture.md, "The projector").
        """
        raise NotImplementedError(f"{type(self).__name__} does not report end offsets")
