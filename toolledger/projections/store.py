"""The LedgerStore port: where the projection lives.

Adapters: `toolledger.projections.postgres.PostgresLedger` and
`toolledger.projections.memory.MemoryLedger`, both run through the contract suite in
`tests/contract/test_ledger_store.py`.

The promise that makes projection exactly-once without Kafka transactions: `apply_batch` writes
the records, the history, the verdicts and the partition's next offset in one atomic step, and
only if the stored next offset still equals the batch's first offset. A zombie projector that
lost its partition therefore applies nothing (`OffsetConflict`), and a crash between "applied"
and "offset saved" cannot happen because they are the same commit.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from toolledger.events.fold import DeadLetter, HistoryEntry, Positioned
from toolledger.events.log import LogIdentity
from toolledger.events.records import CallRecord, RunRecord, Verdict


class StoreError(Exception):
    """The ledger store cannot do what was asked."""


class OffsetConflict(StoreError):
    """The stored next offset moved: another projector owns this partition now."""

    def __init__(self, partition: int, expected: int, actual: int | None) -> None:
        super().__init__(
            f"partition {partition}: expected next offset {expected}, the ledger has {actual}; "
            "another projector took this partition over"
        )
        self.partition = partition
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class PartitionState:
    """What the store knows about one partition of the events topic."""

    partition: int
    next_offset: int
    epoch: uuid.UUID
    partitions: int


class LedgerStore(ABC):
    """The projected ledger: records, runs, history, verdicts, offsets, dead letters."""

    @abstractmethod
    async def start(self) -> None:
        """Connect and apply migrations."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def bind_log(self, identity: LogIdentity) -> dict[int, PartitionState]:
        """Record the log identity on first use (next offset 1: offset 0 is the epoch marker),
        or check it matches what was recorded; raise `LogIdentityError` saying what differs."""

    @abstractmethod
    async def partition_state(self, partition: int) -> PartitionState | None: ...

    @abstractmethod
    async def apply_batch(
        self,
        partition: int,
        start_offset: int,
        next_offset: int,
        items: Sequence[Positioned | DeadLetter],
    ) -> list[Verdict]:
        """Decide and apply `items` (read from `partition`, in offset order, from `start_offset`
        up to but excluding `next_offset`) atomically with the offset move.

        Raises `OffsetConflict` and writes nothing if the stored next offset is not
        `start_offset`. An event_id decided before is skipped (no history, no new verdict).
        Returns the new verdicts in log order.
        """

    @abstractmethod
    async def get_call(self, key: str) -> CallRecord | None: ...

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    async def history(self, key: str) -> list[HistoryEntry]:
        """Every event of `key` (a call key or a run_id), accepted or rejected, in log order."""

    @abstractmethod
    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        """The durable verdicts of those event_ids that have one."""

    @abstractmethod
    async def dead_letters(self) -> list[DeadLetter]: ...

    @abstractmethod
    async def digest(self) -> str:
        """`toolledger.events.fold.ledger_digest` of everything in the store."""
