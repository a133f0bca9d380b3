"""LeaderPort: the runtime port on the fast path, with the direct path underneath.

Reservations (with the read of their key, `read_or_reserve`: one round trip), a runtime's
outcomes, abandons, run events and the fast-path read of a key go to the leader of the run's
partition (`toolledger.leader.projector_side.listener`): the leader appends, proves the offset
and answers with the verdict, so such a call needs no Kafka producer of its own, no LISTEN and
no PostgreSQL read. Everything else (listings, runs, operator events, payload blobs) and every
request the leader cannot serve takes the direct path, the `RuntimePort` this port wraps,
unchanged. The port's promises (`toolledger.port`) hold on both paths. What else it needs of
the ledger under that path is `DirectServices`, four things named below, given by the wiring
(`toolledger.wiring.leader`): this module knows nothing of stacks, projections or PostgreSQL.

An accelerator, never a dependency:

- No leader registered, a connection refused or broken, or no answer within `bound` seconds:
  the call goes direct at once, for the time it has left, and that partition's leader is not
  asked again for `LeaderDirectory.retry_after` seconds.
- A request the leader may have appended before it failed is resent on the direct path with
  the same event_id, which the ledger applies once; so nothing is lost and nothing doubled.
- `APPENDED` (appended, but not proven from memory) awaits the durable verdict, as the direct
  path would after its own append.

Pipelined reservations work unchanged: `append` returns once the leader answered, which is
after Kafka's acknowledgement, and keeps the verdict for the `await_verdict` that follows the
tool if it was watched.

**Reads see this port's writes.** A leader answers before its projection commits, so a read of
PostgreSQL right after an answer could miss what was just decided: a run paused a moment ago,
the twin of a call reserved a moment ago. So every read that goes to PostgreSQL first waits
(`settled`) until the projection committed the last event a leader answered this port for in
the partitions the read covers: the projector commits a partition in offset order, and a
leader answers a partition's batches in that order, so that one verdict row being there means
every earlier answer's rows are too. A port with nothing unsettled there reads at once, which
is the usual case (a reservation's read of its key is answered by the leader, from memory).
Closing the port settles everything, so a process that closed its ledger leaves the projection
caught up with it for the next process to read. A read that must see every process's writes
(`Ledger.read_call` and the other reads a user makes) awaits `fresh` first: the read barrier
(docs/architecture.md, "Reads see every acknowledged write").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Collection
from typing import Protocol

from toolledger.errors import LedgerUnavailable
from toolledger.events.codec import encode
from toolledger.events.log import partition_for
from toolledger.events.models import CallReserved, Event
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.leader.runtime_side.connection import LeaderDirectory
from toolledger.leader.runtime_side.frames import Frame, Kind, runtime_may_append
from toolledger.port import CallQuery, NothingReserved, RuntimePort

#: Seconds a leader has to answer before the call takes the direct path.
DEFAULT_BOUND = 1.0
#: Seconds a read waits for the projection to commit what leaders answered this port (a
#: leader killed after answering costs a failover first), and closing waits for all of it.
SETTLE_TIMEOUT = 10.0
CLOSE_SETTLE_TIMEOUT = 3.0

log = logging.getLogger("toolledger.leader")

#: The answers a leader serves a request with; any other takes the direct path.
_SERVED = {
    Kind.APPEND: frozenset({Kind.VERDICT, Kind.APPENDED}),
    Kind.RESERVE: frozenset({Kind.VERDICT, Kind.APPENDED, Kind.RECORD, Kind.NOT_KNOWN}),
}


class DirectServices(Protocol):
    """What a `LeaderPort` needs of the ledger under its direct path, besides that path's port."""

    @property
    def max_record_bytes(self) -> int:
        """The largest record the log takes: a larger event goes direct, to be refused there."""

    async def offload(self, event: Event) -> Event:
        """`event` with its large payloads stored by reference, as the direct path stores them."""

    async def restored_verdict(self, verdict: Verdict) -> Verdict:
        """`verdict` with its call's payloads back in place."""

    async def committed(self, event_id: uuid.UUID, timeout: float) -> None:
        """Return once the projection committed `event_id`'s verdict; `LedgerUnavailable` if
        it did not within `timeout` seconds."""


class LeaderPort(RuntimePort):
    """`RuntimePort` through partition leaders, falling back to `direct` (see the module)."""

    def __init__(
        self,
        direct: RuntimePort,
        services: DirectServices,
        directory: LeaderDirectory,
        partitions: int,
        bound: float,
    ) -> None:
        self.direct = direct
        self.services = services
        self.directory = directory
        self.partitions = partitions
        self.bound = bound
        self._watched: set[uuid.UUID] = set()
        self._answered: dict[uuid.UUID, Verdict] = {}
        #: Per partition, the last event a leader answered this port for that may not be
        #: committed yet (`settled`).
        self._unsettled: dict[int, uuid.UUID] = {}
        #: Requests the leader answered, and those that took the direct path instead.
        self.stats = {"leader": 0, "direct": 0}
        #: Requests sent to leaders, by kind (`APPEND`, `READ`, `RESERVE`), answered or not.
        self.sent: Counter[str] = Counter()

    @property
    def limits(self) -> PayloadLimits:
        return self.direct.limits

    async def close(self) -> None:
        try:
            await self.settled(timeout=CLOSE_SETTLE_TIMEOUT)
        except LedgerUnavailable as exc:
            log.warning("closing before the projection caught up with the leaders: %s", exc)
        await self.directory.close()

    async def settled(
        self, partitions: Collection[int] | None = None, *, timeout: float = SETTLE_TIMEOUT
    ) -> None:
        """Return once the projection committed everything leaders answered this port for in
        `partitions` (None: all); `LedgerUnavailable` if it does not within `timeout` s."""
        wanted = [
            (p, event_id)
            for p, event_id in self._unsettled.items()
            if partitions is None or p in partitions
        ]
        if not wanted:
            return
        committed = self.services.committed
        try:
            await asyncio.gather(*(committed(event_id, timeout) for _, event_id in wanted))
        except LedgerUnavailable as exc:
            raise LedgerUnavailable(
                f"the ledger in PostgreSQL has not caught up with what the partition leaders "
                f"answered ({exc}); nothing was read. Try again once the projector runs."
            ) from exc
        for p, event_id in wanted:
            if self._unsettled.get(p) == event_id:
                del self._unsettled[p]

    def _settling(self, run_id: str | None) -> Collection[int] | None:
        return None if run_id is None else (partition_for(run_id, self.partitions),)

    # -- the fast path -----------------------------------------------------------------------

    async def _ask(self, partition: int, kind: Kind, body: bytes, within: float) -> Frame | None:
        """The leader's answer, or None (and the leader marked) if it gave none in time."""
        connection = await self.directory.connection(partition)
        if connection is None:
            return None
        self.sent[kind.name] += 1
        try:
            frame = await connection.request(kind, body, max(min(self.bound, within), 0.001))
        except (TimeoutError, OSError) as exc:
            unreachable = None if connection.reached else connection.address
            self.directory.failed(partition, f"{type(exc).__name__} {exc}".strip(), unreachable)
            return None
        if frame.kind is Kind.NOT_LEADER:
            self.directory.moved(partition)
            return None
        return frame

    async def _via_leader(
        self, event: Event, within: float, kind: Kind = Kind.APPEND
    ) -> Frame | None:
        """`VERDICT` or `APPENDED` from the leader (to a `RESERVE`, also `RECORD`: nothing
        appended, and `NOT_KNOWN`: nothing appended, read the key directly); None: take the
        direct path (the leader may have appended it: resend it there)."""
        if not runtime_may_append(event):
            return None
        light = await self.services.offload(event)
        data = encode(light)
        if len(data) > self.services.max_record_bytes:
            return None  # the direct path refuses it (`RecordTooLarge`), as it always did
        partition = partition_for(event.run_id, self.partitions)
        frame = await self._ask(partition, kind, data, within)
        if frame is None or frame.kind not in _SERVED[kind]:
            self.stats["direct"] += 1
            return None
        if frame.kind is Kind.NOT_KNOWN:
            self.stats["direct"] += 1
            return frame
        self.stats["leader"] += 1
        if frame.kind is not Kind.RECORD:
            self._unsettled[partition] = event.event_id
        return frame

    async def _verdict(self, event: Event, frame: Frame, timeout: float) -> Verdict:
        """The verdict a `VERDICT` frame carries, or (`APPENDED`) the durable one."""
        if frame.kind is Kind.APPENDED:
            return await self.direct.await_verdict(event.event_id, timeout)
        verdict = Verdict.model_validate_json(frame.body)
        return await self.services.restored_verdict(verdict)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        started = time.monotonic()
        frame = await self._via_leader(event, timeout)
        if frame is None:
            return await self.direct.append_and_await(event, _left(timeout, started))
        return await self._verdict(event, frame, _left(timeout, started))

    async def read_or_reserve(self, reserved: CallReserved, timeout: float) -> CallRecord | Verdict:
        """One `RESERVE` to the leader: the key's record, or the reservation's verdict (on
        the direct path, `_direct_record` and then the reservation appended and awaited)."""
        started = time.monotonic()
        frame = await self._via_leader(reserved, timeout, Kind.RESERVE)
        if frame is not None and frame.kind is Kind.RECORD:
            return await self.direct.restored_call(CallRecord.model_validate_json(frame.body))
        if frame is not None and frame.kind is not Kind.NOT_KNOWN:
            return await self._verdict(reserved, frame, _left(timeout, started))
        record = await self._direct_record(reserved, frame)
        if record is not None:
            return record
        return await self.direct.append_and_await(reserved, _left(timeout, started))

    async def read_or_append(self, reserved: CallReserved, timeout: float) -> CallRecord | None:
        """One `RESERVE` to the leader, for a pipelined call: the key's record, or None once
        the reservation was appended (its verdict kept if watched, as `append` keeps it)."""
        started = time.monotonic()
        frame = await self._via_leader(reserved, timeout, Kind.RESERVE)
        if frame is not None and frame.kind is Kind.RECORD:
            return await self.direct.restored_call(CallRecord.model_validate_json(frame.body))
        if frame is not None and frame.kind is not Kind.NOT_KNOWN:
            self._keep(reserved, frame)
            return None
        record = await self._direct_record(reserved, frame)
        if record is not None:
            return record
        await self.direct.append(reserved, _left(timeout, started))
        return None

    async def _direct_record(
        self, reserved: CallReserved, frame: Frame | None
    ) -> CallRecord | None:
        """The key's record on the direct path, once the leader did not serve a `RESERVE`;
        None for no record, or for a record of this very reservation.

        After a leader that failed (`frame` None) the reservation may have been appended
        anyway, so a record carrying it is that append landing, not another driver's: the
        caller resends it (same event_id, applied once). A read that fails then is a failed
        reservation (abandon it); after `NOT_KNOWN` nothing was appended (`NothingReserved`).
        """
        try:
            await self.settled(self._settling(reserved.run_id))
            record = await self.direct.read_call(reserved.key)
        except LedgerUnavailable as exc:
            if frame is None:
                raise
            raise NothingReserved(exc) from exc
        if record is not None and record.reservation_id == reserved.reservation_id:
            return None
        return record

    def _keep(self, event: Event, frame: Frame) -> None:
        """Keep a leader's verdict on a watched event for the `await_verdict` to come."""
        if frame.kind is Kind.VERDICT and event.event_id in self._watched:
            self._answered[event.event_id] = Verdict.model_validate_json(frame.body)

    async def append(self, event: Event, timeout: float) -> None:
        started = time.monotonic()
        frame = await self._via_leader(event, timeout)
        if frame is None:
            await self.direct.append(event, _left(timeout, started))
        else:
            self._keep(event, frame)

    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        if await self._via_leader(event, each) is None:
            await self.direct.append_until_landed(event, each=each, pause=pause)

    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        self._watched.discard(event_id)
        answered = self._answered.pop(event_id, None)
        if answered is None:
            return await self.direct.await_verdict(event_id, timeout)
        self.direct.unwatch_verdict(event_id)
        return await self.services.restored_verdict(answered)

    def watch_verdict(self, event_id: uuid.UUID) -> None:
        self._watched.add(event_id)
        self.direct.watch_verdict(event_id)

    def unwatch_verdict(self, event_id: uuid.UUID) -> None:
        self._watched.discard(event_id)
        self._answered.pop(event_id, None)
        self.direct.unwatch_verdict(event_id)

    async def fresh(self, run_ids: Collection[str] | None = None) -> None:
        """The direct path's read barrier, which covers every process's answers, this port's
        too (its ends take the leaders' read index: `toolledger.leader.runtime_side.index`)."""
        await self.direct.fresh(run_ids)

    async def read_call(self, key: str) -> CallRecord | None:
        # The port is given the key alone; a run_id holding ':' is guessed wrong, and the
        # leader then answers NOT_KNOWN (the record it finds names another run).
        run_id = key.split(":", 1)[0]
        body = json.dumps({"key": key, "run_id": run_id}).encode()
        frame = await self._ask(partition_for(run_id, self.partitions), Kind.READ, body, self.bound)
        if frame is None or frame.kind is not Kind.RECORD:
            await self.settled(self._settling(run_id))
            return await self.direct.read_call(key)
        if not frame.body:
            return None
        return await self.direct.restored_call(CallRecord.model_validate_json(frame.body))

    # -- the direct path, once what leaders answered this port is committed --------------------

    async def read_run(self, run_id: str) -> RunRecord | None:
        await self.settled(self._settling(run_id))
        return await self.direct.read_run(run_id)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        await self.settled(self._settling(query.run_id))
        return await self.direct.list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        await self.settled()
        return await self.direct.list_runs(statuses, tenant_id=tenant_id)

    async def restored_call(self, record: CallRecord) -> CallRecord:
        return await self.direct.restored_call(record)


def _left(timeout: float, started: float) -> float:
    """What is left of `timeout` seconds since `started` (monotonic), never quite nothing."""
    return max(timeout - (time.monotonic() - started), 0.001)
