"""The LedgerStore port: where the projection lives.

Adapters: `toolledger.projections.postgres.PostgresLedger` and
`toolledger.projections.memory.MemoryLedger`, both run through the contract suite in
`tests/contract/test_ledger_store.py`.

The promise that makes projection exactly-once without Kafka transactions: `apply_batch` writes
the records, the history, the verdicts and the partition's next offset in one atomic step, and
only if the stored next offset still equals the batch's first offset. A zombie projector that
lost its partition therefore applies nothing (`OffsetConflict`), and a crash between "applied"
and "offset saved" cannot happen because they are the same commit.

The helpers after the port (`check_batch`, `check_identity`, `batch_reads`, `BatchFold`) are
the parts of that promise every adapter shares, so that the stores cannot disagree on what a
batch means, what a changed log looks like, or how a batch folds.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from toolledger.errors import ToolLedgerError
from toolledger.events.fold import (
    DeadLetter,
    Folded,
    HistoryEntry,
    LedgerFold,
    Positioned,
    history_entry,
    ledger_digest,
)
from toolledger.events.log import LogIdentity, LogIdentityError
from toolledger.events.records import UNSETTLED, CallRecord, RunRecord, Verdict
from toolledger.events.signing import VerifyKeys
from toolledger.port import CallQuery
from toolledger.projections.facts import Fact
from toolledger.projections.leases import PartitionLease


class StoreError(ToolLedgerError):
    """The ledger store cannot do what was asked."""

    code = "store_error"


class OffsetConflict(StoreError):
    """The stored next offset moved: another projector owns this partition now."""

    code = "offset_conflict"

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


@dataclass(frozen=True)
class LedgerSnapshot:
    """The whole ledger at one moment: what replay compares and `digest()` covers."""

    calls: dict[str, CallRecord]
    runs: dict[str, RunRecord]
    history: list[HistoryEntry]
    dead_letters: int

    def digest(self) -> str:
        return ledger_digest(
            self.calls.values(), self.runs.values(), self.history, self.dead_letters
        )


@dataclass(frozen=True)
class AppliedBatch:
    """A committed batch's new verdicts in log order, each with its history entry, and their
    JSON when the store serialised them to write them (`stored_json`)."""

    verdicts: list[Verdict]
    history: list[HistoryEntry]
    stored_json: list[str] | None = None

    def verdict_json(self) -> list[str]:
        """Each verdict's `model_dump_json()`: the store's text if it made one, else made now."""
        if self.stored_json is not None:
            return self.stored_json
        return [v.model_dump_json() for v in self.verdicts]


def select_calls(calls: Iterable[CallRecord], query: CallQuery) -> list[CallRecord]:
    """`query` answered by scanning `calls`: the reference the indexed adapters must match."""
    found = sorted((c for c in calls if query.matches(c)), key=lambda c: (c.updated_at, c.key))
    return found[: query.limit]


@dataclass(frozen=True)
class StatusCounts:
    """One tenant's calls per status, and how many `started` ones are past a deadline bound."""

    by_status: dict[str, int]
    overdue: int


def count_statuses(
    calls: Iterable[CallRecord], tenant_id: str | None, deadline_before: datetime
) -> StatusCounts:
    """`StatusCounts` by scanning `calls` (the reference for the adapters' queries)."""
    by_status: dict[str, int] = {}
    overdue = 0
    for call in calls:
        if tenant_id is None or call.tenant_id == tenant_id:
            by_status[call.status] = by_status.get(call.status, 0) + 1
            overdue += call.status == "started" and call.deadline < deadline_before
    return StatusCounts(by_status=by_status, overdue=overdue)


@dataclass(frozen=True)
class CallStats:
    """How many calls are in each status, and how long the unsettled ones have waited.

    `unsettled[(status, seconds)]` counts the `started` and `indeterminate` calls whose record
    has not changed for at least `seconds` (cumulative, so "indeterminate for over an hour" is
    one number to alert on). Every (status, bound) asked for is present, zeros included.
    `resume_failed` counts the runs marked by `run_resume_failed` (their resume hook failed
    every try) that have not moved on since.
    """

    by_status: dict[str, int]
    unsettled: dict[tuple[str, float], int]
    resume_failed: int = 0


def count_calls(
    calls: Iterable[CallRecord],
    now: datetime,
    older_than: Sequence[float],
    runs: Iterable[RunRecord] = (),
) -> CallStats:
    """`CallStats` by scanning `calls` and `runs` (the reference for the adapters' queries)."""
    by_status: dict[str, int] = {}
    unsettled: dict[tuple[str, float], int] = {
        (s, float(b)): 0 for s in sorted(UNSETTLED) for b in older_than
    }
    for call in calls:
        by_status[call.status] = by_status.get(call.status, 0) + 1
        if call.status in UNSETTLED:
            age = (now - call.updated_at).total_seconds()
            for bound in older_than:
                if age >= bound:
                    unsettled[(call.status, float(bound))] += 1
    resume_failed = sum(1 for run in runs if run.resume_error is not None)
    return CallStats(by_status=by_status, unsettled=unsettled, resume_failed=resume_failed)


class LedgerStore(ABC):
    """The projected ledger: records, runs, history, verdicts, offsets, dead letters.

    `verify_keys` are the public keys its batches check operator signatures with (empty for a
    store only read from); the projector halts a partition at an operator event signed with a
    key id not among them rather than let the batch reject it.
    """

    verify_keys: VerifyKeys

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

    async def partition_leases(self) -> list[PartitionLease]:
        """Every owned partition's lease: its owner and the seconds since it last renewed
        (`toolledger.projections.leases`). None here: where one process projects everything
        (the embedded ledger), a stalled owner is a stalled process."""
        return []

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
        return (await self.apply_written(partition, start_offset, next_offset, items)).verdicts

    @abstractmethod
    async def apply_written(
        self,
        partition: int,
        start_offset: int,
        next_offset: int,
        items: Sequence[Positioned | DeadLetter],
    ) -> AppliedBatch:
        """`apply_batch`, returning what it wrote with the verdicts: their history entries and
        JSON, from which the projector builds facts without serialising anything again."""

    async def apply_folded(
        self, partition: int, start_offset: int, next_offset: int, folded: Sequence[Folded]
    ) -> AppliedBatch:
        """`apply_written` for records already folded against this ledger's state (a leader's
        fold of the same log, `Folded` in offset order): their verdicts and rows are written as
        they are, each verdict's history entry chained to its key's head (`chained`), with
        the same offset compare-and-set. Nothing is decided again. This default folds the
        records again; adapters write the results."""
        items = [f.item for f in folded]
        return await self.apply_written(partition, start_offset, next_offset, items)

    @abstractmethod
    async def get_call(self, key: str) -> CallRecord | None: ...

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    async def history(self, key: str) -> list[HistoryEntry]:
        """Every event whose key is `key`, accepted or rejected, in log order: a call key gives
        that call's events, a run_id the run's own events (started, checkpointed, ...)."""

    @abstractmethod
    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        """The durable verdicts of those event_ids that have one."""

    @abstractmethod
    async def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter, in (partition, offset) order."""

    @abstractmethod
    async def snapshot(self) -> LedgerSnapshot:
        """Every record, run and history entry (in log order) and the dead-letter count, read
        consistently."""

    async def digest(self) -> str:
        """`toolledger.events.fold.ledger_digest` of everything in the store."""
        return (await self.snapshot()).digest()

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """The calls `query` selects, oldest `updated_at` first (ties by key), at most
        `query.limit`. This default scans a snapshot; adapters answer from an index."""
        return select_calls((await self.snapshot()).calls.values(), query)

    async def list_runs(
        self,
        statuses: Collection[str],
        tenant_id: str | None = None,
        limit: int = 500,
        *,
        resume_failed: bool = False,
    ) -> list[RunRecord]:
        """Runs in one of `statuses` (e.g. the paused ones), oldest change first; with
        `resume_failed`, only those marked by `run_resume_failed`. This default scans a
        snapshot; adapters answer from an index."""
        runs = [
            r
            for r in (await self.snapshot()).runs.values()
            if r.status in statuses
            and (tenant_id is None or r.tenant_id == tenant_id)
            and (r.resume_error is not None or not resume_failed)
        ]
        runs.sort(key=lambda r: (r.updated_at is None, r.updated_at, r.run_id))
        return runs[:limit]

    async def call_stats(self, now: datetime, older_than: Sequence[float]) -> CallStats:
        """Calls per status and unsettled calls per age bound (see `CallStats`), as of `now`.
        This default scans a snapshot; adapters count in place."""
        snapshot = await self.snapshot()
        return count_calls(snapshot.calls.values(), now, older_than, snapshot.runs.values())

    async def status_counts(self, tenant_id: str | None, deadline_before: datetime) -> StatusCounts:
        """The tenant's calls per status and its `started` calls whose deadline passed before
        `deadline_before` (the console's counts). This default scans a snapshot."""
        return count_statuses((await self.snapshot()).calls.values(), tenant_id, deadline_before)

    @abstractmethod
    async def record_halt(self, partition: int, offset: int, reason: str | None) -> None:
        """Record that this process's projector halted `partition` at `offset` and why (None:
        it is not halted), for `toolledger status`; the fold never reads it."""

    @abstractmethod
    async def register_verify_keys(self) -> VerifyKeys:
        """Register `verify_keys` as this ledger's projectors' key set; the set afterwards.

        Raises `KeySetMismatch` (nothing registered) when a registered key id is missing from
        `verify_keys` or has another public key there.
        """

    @abstractmethod
    async def registered_keys(self) -> VerifyKeys:
        """The public keys this ledger's projectors registered (empty before any started)."""

    @abstractmethod
    async def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store payloads by their digest (`toolledger.events.payloads.digest_of`), durably,
        before the event that references them is appended. Content-addressed: storing a blob
        again changes nothing. Blobs are never changed or removed."""

    @abstractmethod
    async def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        """The stored payloads among `digests`; a digest with no blob is left out."""

    @abstractmethod
    async def facts_since(self, partition: int, offset: int, limit: int) -> list[Fact]:
        """The verdicts of `partition` from `offset` on, with their events, in log order: what
        a new owner republishes to the facts topic (at most `limit`)."""

    @abstractmethod
    async def facts_published(self, partition: int) -> int:
        """The offset before which the partition's facts are known published (0 if never)."""

    @abstractmethod
    async def mark_facts_published(self, partition: int, offset: int) -> None:
        """Record that facts before `offset` are published; never moves the mark back."""


def check_batch(
    partition: int, start_offset: int, next_offset: int, items: Sequence[Positioned | DeadLetter]
) -> None:
    """Refuse a batch that is not what `apply_batch` promises to receive.

    A batch out of order or from another partition would be folded in the wrong order and
    stored under positions it was not read from; that is a projector bug, so it fails loudly
    before anything is written.
    """
    if next_offset < start_offset:
        raise ValueError(f"partition {partition}: batch ends at {next_offset} < {start_offset}")
    previous = start_offset - 1
    for item in items:
        if item.partition != partition or not previous < item.offset < next_offset:
            raise ValueError(
                f"partition {partition}: record at {item.partition}/{item.offset} does not belong "
                f"to a batch of offsets [{start_offset}, {next_offset}) in log order"
            )
        previous = item.offset


def check_identity(identity: LogIdentity, stored: Mapping[int, PartitionState]) -> None:
    """Raise `LogIdentityError` if the log is not the one `stored` offsets were taken from."""
    epochs = {state.epoch for state in stored.values()}
    counts = {state.partitions for state in stored.values()} | {len(stored)}
    if epochs != {identity.epoch}:
        found = ", ".join(sorted(str(e) for e in epochs))
        raise LogIdentityError(
            f"topic {identity.topic} holds epoch {identity.epoch} at offset 0, but this ledger "
            f"was projected from epoch {found}: the topic was recreated or the broker lost its "
            "data, and folding it would silently start a different history. Restore the "
            "original topic, or project the new log into a new, empty ledger schema."
        )
    if counts != {identity.partitions}:
        found = ", ".join(str(c) for c in sorted(counts))
        raise LogIdentityError(
            f"topic {identity.topic} has {identity.partitions} partitions, but this ledger was "
            f"projected from {found}: a run's events now hash to another partition and would be "
            "folded out of order. Never change the partition count of the events topic; restore "
            "it, or migrate to a new topic with a new, empty ledger schema."
        )


def batch_reads(
    items: Sequence[Positioned | DeadLetter],
) -> tuple[set[str], set[str], set[uuid.UUID]]:
    """What a store must load before folding `items`: call keys, run_ids and event_ids."""
    keys: set[str] = set()
    runs: set[str] = set()
    event_ids: set[uuid.UUID] = set()
    for item in items:
        if isinstance(item, DeadLetter):
            if item.run_id is not None:
                runs.add(item.run_id)
            continue
        event = item.event
        runs.add(event.run_id)
        event_ids.add(event.event_id)
        if event.tool_call_id is not None:
            keys.add(event.key)
    return keys, runs, event_ids


@dataclass(frozen=True)
class BatchOutcome:
    """What folding one batch changed: the rows a store writes in the batch's transaction."""

    verdicts: list[Verdict]
    history: list[HistoryEntry]
    dead_letters: list[DeadLetter]
    calls: list[CallRecord]
    runs: list[RunRecord]
    heads: dict[str, str]
    #: Each verdict's `model_dump_json()`, when whoever folded the batch made them.
    verdict_json: list[str] | None = None


class BatchFold:
    """A batch folded with `LedgerFold.apply` against only the state it touches.

    `calls`, `runs` and `decided` are the stored records and already-decided event_ids named by
    `batch_reads(items)`, `heads` the chain hashes of the latest history entries of those call
    keys and run_ids (a key with no history yet is absent). `decide()` and the chains read
    nothing else, so this is the same fold as applying the items to the whole ledger, which is
    why every store uses it rather than its own loop.
    Items are applied one at a time so that a store can write what is decided while the rest
    of the batch is still being folded.
    """

    def __init__(
        self,
        calls: Mapping[str, CallRecord],
        runs: Mapping[str, RunRecord],
        decided: Collection[uuid.UUID],
        keys: VerifyKeys,
        heads: Mapping[str, str],
    ) -> None:
        self._calls = calls
        self._runs = runs
        self._decided = decided
        self._fold = LedgerFold(keys=keys, calls=dict(calls), runs=dict(runs), heads=dict(heads))
        self.verdicts: list[Verdict] = []

    @property
    def history(self) -> list[HistoryEntry]:
        """One entry per verdict so far, in the same (log) order."""
        return self._fold.history

    def apply(self, item: Positioned | DeadLetter) -> None:
        if isinstance(item, Positioned) and item.event.event_id in self._decided:
            return
        verdict = self._fold.apply(item)
        if verdict is not None:
            self.verdicts.append(verdict)

    def outcome(self) -> BatchOutcome:
        """Everything the batch changed; a changed record is one the fold replaced (a rejected
        event leaves the very same object in place)."""
        fold = self._fold
        return BatchOutcome(
            verdicts=self.verdicts,
            history=fold.history,
            dead_letters=fold.dead_letters,
            calls=[c for key, c in fold.calls.items() if self._calls.get(key) is not c],
            runs=[r for run_id, r in fold.runs.items() if self._runs.get(run_id) is not r],
            heads={entry.key: entry.chain_hash for entry in fold.history},
        )


def chained(folded: Sequence[Folded], heads: Mapping[str, str]) -> BatchOutcome:
    """What a batch folded elsewhere writes (the `BatchOutcome` `BatchFold` gives for the same
    records): its verdicts, each with a history entry chained to the head of its key (`heads`:
    the latest entry's chain hash of each key the batch names that has one), the last call and
    run each record left, and its dead letters. Building an entry decides nothing: it records
    the verdict with the event's JSON and the chain hash."""
    heads = dict(heads)
    verdicts: list[Verdict] = []
    texts: list[str] = []
    history: list[HistoryEntry] = []
    dead: list[DeadLetter] = []
    calls: dict[str, CallRecord] = {}
    runs: dict[str, RunRecord] = {}
    for item, verdict, call, run, text in folded:
        if isinstance(item, DeadLetter):
            dead.append(item)
        elif verdict is not None:
            entry = history_entry(item, verdict, heads.get(item.event.key))
            heads[entry.key] = entry.chain_hash
            history.append(entry)
            verdicts.append(verdict)
            texts.append(verdict.model_dump_json() if text is None else text)
        if call is not None:
            calls[call.key] = call
        if run is not None:
            runs[run.run_id] = run
    return BatchOutcome(
        verdicts=verdicts,
        history=history,
        dead_letters=dead,
        calls=list(calls.values()),
        runs=list(runs.values()),
        heads={entry.key: entry.chain_hash for entry in history},
        verdict_json=texts,
    )


def history_keys(folded: Sequence[Folded]) -> set[str]:
    """The keys whose chain heads `chained` reads for `folded`."""
    return {
        f.item.event.key for f in folded if f.verdict is not None and isinstance(f.item, Positioned)
    }


def fold_batch(
    items: Sequence[Positioned | DeadLetter],
    calls: Mapping[str, CallRecord],
    runs: Mapping[str, RunRecord],
    decided: Collection[uuid.UUID],
    keys: VerifyKeys,
    heads: Mapping[str, str],
) -> BatchOutcome:
    """`BatchFold` over all of `items` at once."""
    batch = BatchFold(calls, runs, decided, keys, heads)
    for item in items:
        batch.apply(item)
    return batch.outcome()
