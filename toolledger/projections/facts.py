"""Facts: every verdict the projector reached, published to `toolledger.ledger`.

Processors and analytics consume facts, never requests, so nobody reacts to an event the ledger
rejected. Publishing is at least once: after each commit the projector publishes that batch's
verdicts and records how far it got per partition in PostgreSQL (lazily, at most every
`mark_interval` seconds); when it takes a partition over it first republishes everything after
the recorded position. Consumers drop repeats by event_id.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, TypeAdapter

from toolledger.events.fold import DeadLetter, Positioned
from toolledger.events.log import EventLog
from toolledger.events.models import AnyEvent, Event
from toolledger.events.records import Verdict

_EVENT: TypeAdapter[Event] = TypeAdapter(AnyEvent)


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

    def headers(self) -> list[tuple[str, bytes]]:
        return [
            ("event_id", str(self.verdict.event_id).encode()),
            ("event_type", self.verdict.event_type.encode()),
            ("accepted", b"1" if self.verdict.accepted else b"0"),
        ]


def facts_of(items: Sequence[Positioned | DeadLetter], verdicts: Sequence[Verdict]) -> list[Fact]:
    """Pair a batch's verdicts with the positions and bodies of the events they decided."""
    by_id: dict[uuid.UUID, Positioned] = {}
    for item in items:
        if isinstance(item, Positioned):
            by_id.setdefault(item.event.event_id, item)  # a resend keeps the first position
    facts = []
    for verdict in verdicts:
        item = by_id[verdict.event_id]
        facts.append(
            Fact(
                partition=item.partition,
                offset=item.offset,
                verdict=verdict,
                event_json=item.event.history_json(),
            )
        )
    return facts


class FactsPublisher:
    """Appends facts to the facts topic, keyed by run_id like the requests."""

    def __init__(self, log: EventLog, mark_interval: float = 0.5) -> None:
        self.log = log
        self.mark_interval = mark_interval
        self._last_mark: dict[int, float] = {}
        self.published = 0

    async def publish(self, facts: Sequence[Fact]) -> None:
        await asyncio.gather(
            *(
                self.log.append(f.verdict.run_id, f.model_dump_json().encode(), f.headers())
                for f in facts
            )
        )
        self.published += len(facts)

    def mark_due(self, partition: int) -> bool:
        """Whether to record the published position now (rate-limited per partition)."""
        now = time.monotonic()
        if now - self._last_mark.get(partition, 0.0) >= self.mark_interval:
            self._last_mark[partition] = now
            return True
        return False
