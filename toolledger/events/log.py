"""The EventLog port: an append-only, partitioned log keyed by run_id.

Adapters: `toolledger.events.kafka.KafkaLog` (aiokafka, acks=all, no transactions) and
`toolledger.events.memory.MemoryLog` (in-process, the embedded default). Both pass one contract
suite (`tests/contract/test_event_log.py`).

Log identity: when toolledger creates a topic it writes an *epoch marker* at offset 0 of every
partition: the same random UUID and the partition count. The projector stores the epoch with its
offsets and checks it on ownership, so a broker that lost its data, a recreated topic or a changed
partition count is detected instead of silently folded as a new history. End offsets are never
used for correctness.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EPOCH_MARKER_KEY = b"toolledger.epoch"
_EPOCH_MARKER_PREFIX = b"TLEPOCH1"


class LogError(Exception):
    """The log cannot be used as asked (unreachable, missing topic, wrong shape)."""


class LogIdentityError(LogError):
    """The log is not the one the ledger was built from; says what happened and what to do."""


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


class LogReader(ABC):
    """Reads assigned partitions from given offsets, in offset order per partition."""

    @abstractmethod
    async def assign(self, positions: Mapping[int, int]) -> None:
        """Read exactly these partitions, each from the given offset (replacing any before)."""

    @abstractmethod
    async def fetch(self, max_wait: float, max_records: int = 10_000) -> dict[int, list[LogRecord]]:
        """Records available now (waiting up to `max_wait` s for the first), by partition."""

    @abstractmethod
    async def close(self) -> None: ...


class EventLog(ABC):
    """An append-only topic.

    Promises: `append` returns only once the record is durable (Kafka: acks=all) and returns its
    position; records with the same key land in the same partition in append order; a partition's
    offsets start at 0 and only grow; nothing is ever rewritten.
    """

    topic: str

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ensure_topic(self, partitions: int) -> LogIdentity:
        """Create the topic with epoch markers if it does not exist; return its identity."""

    @abstractmethod
    async def identity(self) -> LogIdentity:
        """Read the epoch markers at offset 0; raise `LogIdentityError` if any is missing or
        they disagree with each other or with the partition count."""

    @abstractmethod
    async def partition_count(self) -> int: ...

    @abstractmethod
    async def append(
        self, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Position:
        """Append durably; the position once acknowledged."""

    @abstractmethod
    def reader(self) -> LogReader:
        """A new reader with no partitions assigned."""
