"""Facts: every verdict the projector reached, published to `toolledger.ledger`.

Processors and analytics consume facts, never requests, so nobody reacts to an event the ledger
rejected. Publishing is at least once: after each commit the projector publishes that batch's
verdicts and records how far it got per partition in PostgreSQL (lazily, at most every
`mark_interval` seconds); when it takes a partition over it first republishes everything after
the recorded position. Consumers drop repeats by event_id.

**Packed records.** A facts record holds a JSON array of facts, all of runs that land in the
record's partition, in log order (docs/architecture.md, decision 4 of the lean event path). A
record per fact cost the projector more than projecting the event did: a producer send, a task
and a header list each. Per-run order holds because a run's facts always go to the partition its
run_id names and a pack keeps their order; `facts_in` reads packed records and the single-fact
records written before packing, so every consumer (`toolledger.subscribe`, the processors) sees
facts, never packs. A fact's JSON is built once from the text the store already wrote (the
verdict as stored in `verdicts`, the event as stored in the history), not re-serialised.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, TypeAdapter

from toolledger.events.fold import HistoryEntry
from toolledger.events.log import EventLog, partition_for
from toolledger.events.models import AnyEvent, Event
from toolledger.events.records import Verdict

_EVENT: TypeAdapter[Event] = TypeAdapter(AnyEvent)
#: The most fact JSON one record carries (a single larger fact travels alone): well under
#: Kafka's default 1 MB message limit and the facts producer's 512 KB batches.
PACK_BYTES = 256 * 1024


class Fact(BaseModel):
    """A decided request: the verdict, the request's position and the request itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: int
    offset: int
    verdict: Verdict
    event_json: str

    @property
    def event(self) -> Event:
        """The request this fact decided, as its typed model."""
        return _EVENT.validate_json(self.event_json)

    @property
    def occurred_at(self) -> datetime:
        """When the request was made (its envelope's `occurred_at`)."""
        return self.event.occurred_at


_PACKED: TypeAdapter[list[Fact]] = TypeAdapter(list[Fact])


def facts_in(value: bytes) -> list[Fact]:
    """The facts a facts-topic record holds, in order: a packed record (a JSON array) or a
    single fact as written before packing. Raises `ValueError` for bytes that are neither."""
    if value[:1] == b"[":
        return _PACKED.validate_json(value)
    return [Fact.model_validate_json(value)]


@dataclass(frozen=True, slots=True)
class FactText:
    """One fact, serialised: its run (which picks the partition) and its JSON object."""

    run_id: str
    json: str


def fact_text(fact: Fact) -> FactText:
    """A fact read back from the store (republishing), serialised."""
    return FactText(fact.verdict.run_id, fact.model_dump_json())


def facts_of(
    history: Sequence[HistoryEntry], verdicts: Sequence[Verdict], verdict_json: Sequence[str]
) -> list[FactText]:
    """A committed batch's facts from what the store wrote: each verdict's history entry (its
    position and event JSON) and the verdict's JSON as stored, pasted into the `Fact` shape."""
    return [
        FactText(
            v.run_id,
            f'{{"partition":{h.partition},"offset":{h.offset},"verdict":{j},'
            f'"event_json":{_json_string(h.event_json)}}}',
        )
        for h, v, j in zip(history, verdicts, verdict_json, strict=True)
    ]


#: `json.dumps` of a string, without the call's encoder set-up (the same C function it uses).
_json_string = json.encoder.encode_basestring_ascii


def packs(facts: Sequence[FactText], limit: int = PACK_BYTES) -> Iterator[list[FactText]]:
    """Consecutive runs of `facts` of at most `limit` characters of JSON (at least one fact)."""
    pack: list[FactText] = []
    size = 0
    for fact in facts:
        if pack and size + len(fact.json) > limit:
            yield pack
            pack, size = [], 0
        pack.append(fact)
        size += len(fact.json) + 1
    if pack:
        yield pack


class FactsPublisher:
    """Appends facts to the facts topic, keyed by run_id like the requests."""

    def __init__(
        self, log: EventLog, mark_interval: float = 0.5, pack_bytes: int = PACK_BYTES
    ) -> None:
        self.log = log
        self.mark_interval = mark_interval
        self.pack_bytes = pack_bytes
        self._last_mark: dict[int, float] = {}
        self._partitions = 0
        self._partition_of: dict[str, int] = {}
        self.published = 0

    async def publish(self, facts: Sequence[FactText]) -> None:
        """Append `facts` (in log order) packed per facts partition; returns once all are
        acknowledged. The packs of one partition are appended in order."""
        if not facts:
            return
        if not self._partitions:  # the partition count of a topic never changes
            self._partitions = await self.log.partition_count()
        groups: dict[int, list[FactText]] = {}
        for fact in facts:
            groups.setdefault(self._partition(fact.run_id), []).append(fact)
        appends = [
            self.log.append(
                pack[0].run_id,
                f"[{','.join(f.json for f in pack)}]".encode(),
                [("facts", str(len(pack)).encode())],
            )
            for group in groups.values()
            for pack in packs(group, self.pack_bytes)
        ]
        if len(appends) == 1:  # the usual small batch: no task for a gather of one
            await appends[0]
        else:
            await asyncio.gather(*appends)
        self.published += len(facts)

    def _partition(self, run_id: str) -> int:
        """`partition_for` (pure-Python murmur2), remembered: a run has many facts."""
        partition = self._partition_of.get(run_id)
        if partition is None:
            if len(self._partition_of) >= 100_000:
                self._partition_of.clear()
            partition = self._partition_of[run_id] = partition_for(run_id, self._partitions)
        return partition

    def mark_due(self, partition: int) -> bool:
        """Whether to record the published position now (rate-limited per partition)."""
        now = time.monotonic()
        if now - self._last_mark.get(partition, 0.0) >= self.mark_interval:
            self._last_mark[partition] = now
            return True
        return False
