"""The in-memory ledger store: the embedded default and users' unit tests.

A thin shell around `LedgerFold` that adds what the fold leaves to stores: partition offsets
with the same compare-and-set as PostgreSQL, the log identity, and a way for waiters to hear
about new verdicts. A batch is folded with `fold_batch` against the records it touches and
merged only when the whole batch folded, so a batch is applied entirely or not at all, as in
PostgreSQL's transaction; the contract suite holds both stores to the same results.

Nothing here survives the process; that is the point of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime

from toolledger.events.fold import DeadLetter, Folded, HistoryEntry, LedgerFold, Positioned
from toolledger.events.log import LogIdentity
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.events.signing import VerifyKeys, check_key_set
from toolledger.port import CallQuery
from toolledger.projections.facts import Fact
from toolledger.projections.gc_pause import gc_paused
from toolledger.projections.store import (
    AppliedBatch,
    BatchOutcome,
    CallStats,
    LedgerSnapshot,
    LedgerStore,
    OffsetConflict,
    PartitionState,
    StatusCounts,
    batch_reads,
    chained,
    check_batch,
    check_identity,
    count_calls,
    count_statuses,
    fold_batch,
    history_keys,
    select_calls,
)


class MemoryLedger(LedgerStore):
    """The ledger in a `LedgerFold`, with offsets; one asyncio.Lock serializes batches."""

    def __init__(self, *, verify_keys: VerifyKeys | None = None) -> None:
        self.verify_keys = verify_keys or VerifyKeys()
        self._fold = LedgerFold(keys=self.verify_keys)
        self._offsets: dict[int, PartitionState] = {}
        self._lock = asyncio.Lock()
        self._subscribers: set[asyncio.Queue[uuid.UUID]] = set()
        self._history_by_key: dict[str, list[HistoryEntry]] = {}
        # The keys of each run, so a run's calls are listed without scanning every call (the
        # duplicate-intent guard asks for them before each new call of a run).
        self._keys_by_run: dict[str, dict[str, None]] = {}
        self._published: dict[int, int] = {}
        self._registered = VerifyKeys()
        self._blobs: dict[str, bytes] = {}
        #: Halted partitions and why (`record_halt`): nobody outside this process reads them.
        self.halts: dict[int, str] = {}

    @property
    def fold(self) -> LedgerFold:
        """The underlying fold (read it, do not change it)."""
        return self._fold

    async def start(self) -> None:
        """Nothing to connect to or migrate."""

    async def close(self) -> None:
        """Nothing to release; the ledger stays readable."""

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[asyncio.Queue[uuid.UUID]]:
        """A queue that receives the event_id of every verdict applied while it is open.

        The in-memory counterpart of LISTEN on `PostgresLedger.notify_channel`: a hint, put
        after the batch is applied; the waiter reads the verdict itself with `verdicts()`.
        """
        queue: asyncio.Queue[uuid.UUID] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    async def bind_log(self, identity: LogIdentity) -> dict[int, PartitionState]:
        async with self._lock:
            if not self._offsets:
                self._offsets = {
                    p: PartitionState(p, 1, identity.epoch, identity.partitions)
                    for p in range(identity.partitions)
                }
            check_identity(identity, self._offsets)
            return dict(self._offsets)

    async def partition_state(self, partition: int) -> PartitionState | None:
        return self._offsets.get(partition)

    async def apply_written(
        self,
        partition: int,
        start_offset: int,
        next_offset: int,
        items: Sequence[Positioned | DeadLetter],
    ) -> AppliedBatch:
        check_batch(partition, start_offset, next_offset, items)
        async with self._lock:
            state = self._check_offset(partition, start_offset)
            fold = self._fold
            keys, run_ids, event_ids = batch_reads(items)
            outcome = fold_batch(
                items,
                {k: fold.calls[k] for k in keys if k in fold.calls},
                {r: fold.runs[r] for r in run_ids if r in fold.runs},
                {e for e in event_ids if e in fold.verdicts},
                fold.keys,
                {k: fold.heads[k] for k in keys | run_ids if k in fold.heads},
            )
            self._merge(outcome, state, next_offset)
        return self._announced(outcome)

    async def apply_folded(
        self, partition: int, start_offset: int, next_offset: int, folded: Sequence[Folded]
    ) -> AppliedBatch:
        check_batch(partition, start_offset, next_offset, [f.item for f in folded])
        async with self._lock:
            state = self._check_offset(partition, start_offset)
            heads = self._fold.heads
            wanted = history_keys(folded)
            outcome = chained(folded, {k: heads[k] for k in wanted if k in heads})
            self._merge(outcome, state, next_offset)
        return self._announced(outcome)

    def _check_offset(self, partition: int, start_offset: int) -> PartitionState:
        state = self._offsets.get(partition)
        if state is None or state.next_offset != start_offset:
            raise OffsetConflict(
                partition, start_offset, None if state is None else state.next_offset
            )
        return state

    def _merge(self, outcome: BatchOutcome, state: PartitionState, next_offset: int) -> None:
        """Write a batch's outcome and move its partition's offset (holding the lock)."""
        fold = self._fold
        fold.calls.update((c.key, c) for c in outcome.calls)
        for call in outcome.calls:
            self._keys_by_run.setdefault(call.run_id, {})[call.key] = None
        fold.runs.update((r.run_id, r) for r in outcome.runs)
        fold.history.extend(outcome.history)
        fold.heads.update(outcome.heads)
        for entry in outcome.history:
            self._history_by_key.setdefault(entry.key, []).append(entry)
        fold.verdicts.update((v.event_id, v) for v in outcome.verdicts)
        fold.dead_letters.extend(outcome.dead_letters)
        self._offsets[state.partition] = PartitionState(
            state.partition, next_offset, state.epoch, state.partitions
        )

    def _announced(self, outcome: BatchOutcome) -> AppliedBatch:
        for queue in self._subscribers:
            for verdict in outcome.verdicts:
                queue.put_nowait(verdict.event_id)
        return AppliedBatch(outcome.verdicts, outcome.history, outcome.verdict_json)

    async def get_call(self, key: str) -> CallRecord | None:
        return self._fold.calls.get(key)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return self._fold.runs.get(run_id)

    async def history(self, key: str) -> list[HistoryEntry]:
        return list(self._history_by_key.get(key, ()))

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        calls = self._fold.calls
        if query.run_id is not None:
            keys = self._keys_by_run.get(query.run_id, {})
            return select_calls((calls[k] for k in keys), query)
        return select_calls(calls.values(), query)

    async def record_halt(self, partition: int, offset: int, reason: str | None) -> None:
        if reason is None:
            self.halts.pop(partition, None)
        else:
            self.halts[partition] = reason

    async def call_stats(self, now: datetime, older_than: Sequence[float]) -> CallStats:
        return count_calls(self._fold.calls.values(), now, older_than, self._fold.runs.values())

    async def status_counts(self, tenant_id: str | None, deadline_before: datetime) -> StatusCounts:
        return count_statuses(self._fold.calls.values(), tenant_id, deadline_before)

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        found = self._fold.verdicts
        return {e: found[e] for e in event_ids if e in found}

    async def dead_letters(self) -> list[DeadLetter]:
        return sorted(self._fold.dead_letters, key=lambda d: (d.partition, d.offset))

    async def snapshot(self) -> LedgerSnapshot:
        fold = self._fold
        return LedgerSnapshot(
            calls=dict(fold.calls),
            runs=dict(fold.runs),
            history=sorted(fold.history, key=lambda e: (e.partition, e.offset)),
            dead_letters=len(fold.dead_letters),
        )

    async def digest(self) -> str:
        # As a snapshot is: its lines are made before collection resumes (`gc_pause`).
        with gc_paused():
            return self._fold.digest()

    async def facts_since(self, partition: int, offset: int, limit: int) -> list[Fact]:
        fold = self._fold
        entries = sorted(
            (e for e in fold.history if e.partition == partition and e.offset >= offset),
            key=lambda e: e.offset,
        )
        return [
            Fact(
                partition=e.partition,
                offset=e.offset,
                verdict=fold.verdicts[e.event_id],
                event_json=e.event_json,
            )
            for e in entries[:limit]
        ]

    async def facts_published(self, partition: int) -> int:
        return self._published.get(partition, 0)

    async def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        for digest, data in blobs.items():
            self._blobs.setdefault(digest, bytes(data))

    async def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        return {d: self._blobs[d] for d in digests if d in self._blobs}

    async def mark_facts_published(self, partition: int, offset: int) -> None:
        self._published[partition] = max(offset, self._published.get(partition, 0))

    async def register_verify_keys(self) -> VerifyKeys:
        check_key_set(self.verify_keys, self._registered)
        self._registered = VerifyKeys({**self._registered.raw, **self.verify_keys.raw})
        return self._registered

    async def registered_keys(self) -> VerifyKeys:
        return self._registered
