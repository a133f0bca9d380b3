"""The drill worker's runtime port: the ledger-side kill points, a retrying producer, and a
record of every verdict the runtime heard and which path answered it.

A worker runs its runs on the port a runtime gets (`TOOLLEDGER_LEADER=auto`: a `LeaderPort` over
the direct path; `off`: the direct path alone) wrapped in `DrillPort`, so every road of a call
goes through it, the leader's included:

- **Kill points** around the ledger: `reserved` once a reservation's accepted verdict came
  back, `before_outcome` and `after_outcome` around the runtime's outcome append.
- **A producer that retries** (`Duplicates`): now and then an event's bytes are appended to
  Kafka a second time, right away or after later events, straight to the log and never through
  the leader, which therefore meets them as foreign records. Each must be applied once.
- **The verdicts heard** (`toolledger.drill.verdicts`): each verdict a call of the runtime
  received is written down before the runtime acts on it, with the path that answered:
  `leader` (answered by a partition leader from memory) or `direct` (the projection's durable
  verdict, after a direct append or when the leader only appended). `DirectPath`, the direct
  path under the leader port, says which: it marks the call in progress (a context variable,
  so concurrent runs of one worker never mark each other's calls) whenever it is taken.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from toolledger.drill.acked import AckRecord
from toolledger.drill.killpoints import KillPoints, append_line
from toolledger.drill.verdicts import VerdictRecord, Via
from toolledger.events.codec import encode
from toolledger.events.log import LogError
from toolledger.events.models import (
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallReserved,
    Event,
)
from toolledger.events.records import CallRecord, Verdict
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.runtime.forwarding import ForwardingPort
from toolledger.wiring.leader import StackLeaderPort
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

#: The path of the call in progress in this task: set by `DrillPort`, marked by `DirectPath`.
_VIA: ContextVar[list[Via] | None] = ContextVar("toolledger_drill_via", default=None)


class DirectPath(StackPort):
    """The direct path, marking the call in progress as answered by it whenever it is taken."""

    @staticmethod
    def _taken() -> None:
        cell = _VIA.get()
        if cell is not None:
            cell[0] = "direct"

    async def append(self, event: Event, timeout: float) -> None:
        self._taken()
        await super().append(event, timeout)

    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        self._taken()
        await super().append_until_landed(event, each=each, pause=pause)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        self._taken()
        return await super().append_and_await(event, timeout)

    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        self._taken()
        return await super().await_verdict(event_id, timeout)


@dataclass
class Duplicates:
    """A producer that retries: appends an event's bytes again, now or after later events."""

    rate: float
    log: Path | None
    rng: random.Random
    _later: list[Event] = field(default_factory=list)

    def pick(self, event: Event) -> Event | None:
        """The event to append a second time after `event`, if any."""
        if self.rate <= 0:
            return None
        roll = self.rng.random()
        if roll < self.rate:
            return event
        if roll < 2 * self.rate:
            self._later.append(event)
            return None
        return self._later.pop(0) if self._later and roll > 1 - self.rate else None


def _runtime_outcome(event: Event) -> bool:
    if isinstance(event, CallCompleted | CallFailed):
        return event.source == "runtime"
    return isinstance(event, CallIndeterminate)


class DrillPort(ForwardingPort):
    """`inner` (a `LeaderPort` over a `DirectPath`, or a `DirectPath`) with the drill's kill
    points, duplicate appends and verdict record (see the module docstring)."""

    def __init__(
        self,
        inner: StackLeaderPort | StackPort,
        kill_points: KillPoints,
        verdicts: VerdictRecord,
        acked: AckRecord | None = None,
    ) -> None:
        super().__init__(inner)
        self.stack: LedgerStack = inner.stack
        self.kill_points = kill_points
        self.verdicts = verdicts
        self.acked = acked or AckRecord(None)
        #: Set once the worker has its order (its seed); until then nothing is appended twice.
        self.duplicates = Duplicates(0.0, None, random.Random(0))
        self._first: Via = "leader" if isinstance(inner, LeaderPort) else "direct"

    async def _heard(self, waiting: Awaitable[Verdict]) -> Verdict:
        """The verdict `waiting` gives, written down with the path that answered it."""
        cell: list[Via] = [self._first]
        token = _VIA.set(cell)
        try:
            verdict = await waiting
        finally:
            _VIA.reset(token)
        self.verdicts.write(verdict, cell[0])
        return verdict

    async def _duplicate(self, event: Event) -> None:
        again = self.duplicates.pick(event)
        if again is None:
            return
        if self.duplicates.log is not None:
            append_line(self.duplicates.log, {"event_id": str(again.event_id), "type": again.type})
        with contextlib.suppress(LogError):  # a retry that fails is one that did not happen
            await self.stack.events.append(again.run_id, encode(again))

    @contextlib.asynccontextmanager
    async def _appending(self, event: Event) -> AsyncIterator[None]:
        """Around an append: the outcome kill points, and a retry of some event after it."""
        outcome = _runtime_outcome(event)
        if outcome:
            self.kill_points.reach("before_outcome", event.key)
        yield
        self.acked.write(event)
        await self._duplicate(event)
        if outcome:
            self.kill_points.reach("after_outcome", event.key)

    async def append(self, event: Event, timeout: float) -> None:
        async with self._appending(event):
            await super().append(event, timeout)

    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        async with self._appending(event):
            await super().append_until_landed(event, each=each, pause=pause)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        async with self._appending(event):
            verdict = await self._heard(super().append_and_await(event, timeout))
        if isinstance(event, CallReserved) and verdict.accepted:
            self.kill_points.reach("reserved", event.key)
        return verdict

    async def read_or_reserve(self, reserved: CallReserved, timeout: float) -> CallRecord | Verdict:
        cell: list[Via] = [self._first]
        token = _VIA.set(cell)
        try:
            found = await super().read_or_reserve(reserved, timeout)
        finally:
            _VIA.reset(token)
        if isinstance(found, CallRecord):
            return found  # nothing appended: nothing to retry, no verdict heard
        self.verdicts.write(found, cell[0])
        await self._duplicate(reserved)
        if found.accepted:
            self.kill_points.reach("reserved", reserved.key)
        return found

    async def read_or_append(self, reserved: CallReserved, timeout: float) -> CallRecord | None:
        found = await super().read_or_append(reserved, timeout)
        if found is None:  # appended: a producer's retry may append it again
            self.acked.write(reserved)
            await self._duplicate(reserved)
        return found

    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        return await self._heard(super().await_verdict(event_id, timeout))
