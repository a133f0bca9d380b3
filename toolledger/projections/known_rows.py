"""What a PostgreSQL store remembers of each partition's rows, so a live batch costs one round trip.

Only the owner of a partition writes its rows, and a batch commits only if the stored offset is
the one it started from, so the store that wrote the previous batch knows every row the next one
reads (`KnownRows`). A batch is folded on those rows; whatever the store never saw it assumes
absent, and the statement that writes the batch probes each assumption (`Assumed`) and writes
nothing if one fails (`toolledger.projections.postgres`).

A batch a leader folded already (`Folded`, `PostgresLedger.apply_folded`) reads no rows: only
its history entries need their keys' chain heads, taken from here the same way (`heads`).
What such a batch wrote is learnt like any other (`learn`), so the rows remembered stay what
PostgreSQL holds whichever way a batch was folded.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from toolledger.events.fold import DeadLetter, Positioned
from toolledger.events.records import CallRecord, RunRecord
from toolledger.projections.batch_sql import Assumed
from toolledger.projections.store import BatchOutcome, batch_reads


@dataclass
class Reads:
    """What a small batch is folded on: stored rows it read or knew, and what it assumed."""

    calls: dict[str, CallRecord]
    runs: dict[str, RunRecord]
    decided: set[uuid.UUID]
    heads: dict[str, str]
    assumed: Assumed = field(default_factory=Assumed)


T = TypeVar("T")


def absent(wanted: set[T], known: Mapping[T, object]) -> list[T]:
    """The members of `wanted` that `known` has no entry for, in time linear in `wanted`.

    Not `wanted - known.keys()`: a set minus a dict's key view walks the whole view (the
    view's reflected difference iterates it), about 26 ns per remembered row here, so up to a
    quarter of a millisecond per operand near `KNOWN_LIMIT`, for a batch of one record.
    """
    return [k for k in wanted if k not in known]


@dataclass
class KnownRows:
    """One partition's rows as this store wrote them, as of `next_offset`.

    Only the owner of a partition writes its rows (every row of a run comes from the run's
    partition), and a batch commits only if the stored offset is still the one it started
    from, so as long as batches follow one another here (`next_offset` is the next batch's
    start) nobody else changed these rows. A row it never saw (written before this process
    took the partition, or since forgotten) is assumed absent and checked by the write.
    `None` records a row known to be absent. Any error or conflict forgets the partition.
    """

    next_offset: int
    calls: dict[str, CallRecord | None] = field(default_factory=dict)
    runs: dict[str, RunRecord | None] = field(default_factory=dict)
    heads: dict[str, str | None] = field(default_factory=dict)
    decided: set[uuid.UUID] = field(default_factory=set)

    def size(self) -> int:
        return len(self.calls) + len(self.runs) + len(self.heads) + len(self.decided)

    def reads(self, items: Sequence[Positioned | DeadLetter]) -> Reads:
        keys, run_ids, event_ids = batch_reads(items)
        calls = {k: c for k in keys if (c := self.calls.get(k)) is not None}
        runs = {r: run for r in run_ids if (run := self.runs.get(r)) is not None}
        heads = {k: h for k in keys | run_ids if (h := self.heads.get(k)) is not None}
        return Reads(
            calls,
            runs,
            event_ids & self.decided,
            heads,
            Assumed(
                calls=sorted(absent(keys, self.calls)),
                runs=sorted(absent(run_ids, self.runs)),
                histories=sorted(absent(keys | run_ids, self.heads)),
                verdicts=sorted(event_ids - self.decided),
            ),
        )

    def read_all(self, items: Sequence[Positioned | DeadLetter], reads: Reads) -> None:
        """`reads` was loaded for `items`: what it lacks is absent from the ledger."""
        keys, run_ids, _ = batch_reads(items)
        self.calls.update(dict.fromkeys(absent(keys, reads.calls)))
        self.runs.update(dict.fromkeys(absent(run_ids, reads.runs)))
        self.heads.update(dict.fromkeys(absent(keys | run_ids, reads.heads)))

    def heads_for(self, keys: Collection[str]) -> Reads:
        """The chain heads of `keys` it knows, the rest assumed absent: all a batch folded
        elsewhere reads (`chained`)."""
        heads = {k: h for k in keys if (h := self.heads.get(k)) is not None}
        absent_heads = sorted(k for k in keys if k not in self.heads)
        return Reads({}, {}, set(), heads, Assumed(histories=absent_heads))

    def learn(self, next_offset: int, reads: Reads, outcome: BatchOutcome) -> None:
        """What the batch read and wrote, which is now the ledger's state of those rows."""
        for key in reads.assumed.calls:
            self.calls.setdefault(key, None)
        for run_id in reads.assumed.runs:
            self.runs.setdefault(run_id, None)
        for key in reads.assumed.histories:
            self.heads.setdefault(key, None)
        self.calls.update(reads.calls)
        self.runs.update(reads.runs)
        self.heads.update(reads.heads)
        self.decided |= reads.decided
        self.calls.update((c.key, c) for c in outcome.calls)
        self.runs.update((r.run_id, r) for r in outcome.runs)
        self.heads.update(outcome.heads)
        self.decided.update(v.event_id for v in outcome.verdicts)
        self.next_offset = next_offset
