"""The leader: the projector process answering runtimes for the partitions it holds.

It is not a service of its own. The projector that holds a partition's advisory lock tells the
leader (`PartitionFollower`), which then keeps that partition's fold in memory
(`LeaderPartition`), registers its address on the partition's ownership row, and answers
`APPEND`, `READ` and `RESERVE` (a read, and an append if the key is new) requests for it over
length-prefixed frames (`toolledger.leader.runtime_side.frames`), and `READ_INDEX`: where its
memory ends (the read barrier's read index).
A request for a partition it does not lead is answered `NOT_LEADER`, with the registered
leader when it knows one; so is one while this process cannot vouch for its lease on the
partition (`owns`: after a stall, until PostgreSQL confirms it; `toolledger.projections.ownership`).
Ownership stays PostgreSQL's locks, order and durability Kafka's.

What a runtime may append is all it accepts: reservations, a runtime's own outcomes, abandons
and run events. An operator decision, a reconcile finding or a compensation outcome is
`REFUSED` and nothing of it is appended (operator events are signed and go through the API).
A frame that breaks the format, an unknown kind, or bytes that do not decode as an event close
that connection with the reason in the log; the projector never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from toolledger.events.codec import DecodeError, decode
from toolledger.events.fold import DeadLetter, Folded, Positioned
from toolledger.events.log import EventLog, partition_for
from toolledger.events.models import CallReserved, Event
from toolledger.events.records import CallRecord
from toolledger.events.signing import VerifyKeys
from toolledger.leader.projector_side.appender import Answer, GapReader, PartitionAppender
from toolledger.leader.projector_side.partition import (
    LeaderBehind,
    LeaderPartition,
    LeaderSuperseded,
)
from toolledger.leader.projector_side.reads import LeaderReads
from toolledger.leader.projector_side.tls import server_options
from toolledger.leader.runtime_side.frames import (
    DEFAULT_MAX_BODY,
    Frame,
    FrameError,
    FrameWriter,
    Kind,
    encode_frame,
    read_frame,
    runtime_may_append,
)
from toolledger.projections.dberrors import database_errors
from toolledger.projections.following import PartitionFollower, Proven
from toolledger.settings import split_address

log = logging.getLogger("toolledger.leader")


class LeaderServer(PartitionFollower):
    """Serves the partitions its projector holds, on `host:port` (port 0: any free one), over
    TLS with `tls` (`toolledger.leader.projector_side.tls.server_context`), else plain TCP."""

    def __init__(
        self,
        events: EventLog,
        reads: LeaderReads,
        keys: VerifyKeys,
        partitions: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = DEFAULT_MAX_BODY,
        tls: ssl.SSLContext | None = None,
        advertise: str | None = None,
        owns: Callable[[int], bool] | None = None,
    ) -> None:
        self.events = events
        self.reads = reads
        self.keys = keys
        self.partitions = partitions
        self.max_body = max_body
        self._host, self._port, self._tls = host, port, tls
        self._server: asyncio.Server | None = None
        self._led: dict[int, PartitionAppender] = {}
        self._gaps = GapReader(events, keys)
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        #: Where it listens, and what it registers for runtimes: `advertise` when given (its
        #: host, and its port or the one bound), else the bound address itself.
        self.bound = ""
        self.address = ""
        self._advertise = advertise
        self._closed = False
        self._wake: Callable[[int], None] | None = None
        #: Whether this process's lease on a partition is current (`PartitionLocks.holds`).
        self._owns = owns

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connected, self._host, self._port, **server_options(self._tls)
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self.bound = self.address = f"{host}:{port}"
        shown = ""
        if self._advertise is not None:
            advertised, advertised_port = split_address(self._advertise)
            self.address = f"{advertised}:{advertised_port or port}"
            shown = f", registered for runtimes as {self.address}"
        how = "TLS" if self._tls else "plain TCP"
        log.info("leader listening on %s (%s)%s", self.bound, how, shown)

    async def close(self) -> None:
        self._closed = True  # what the projector says from now on starts nothing
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for partition in list(self._led):
            appender = self._led.pop(partition, None)
            if appender is not None:
                await self._stand_down(partition, appender)
        await self._gaps.close()
        await self.reads.close()

    def led(self) -> dict[int, int]:
        """The partitions answered for now, with the next offset folded in memory."""
        return {p: a.state.next for p, a in self._led.items() if a.state.superseded is None}

    # -- what the projector tells it (PartitionFollower) -----------------------------------

    async def took(self, partition: int, next_offset: int) -> None:
        if self._closed:
            return
        old = self._led.pop(partition, None)
        if old is not None:
            await old.close()
        state = LeaderPartition(partition, next_offset, self.keys)
        appender = PartitionAppender(state, self.events, self.reads.load, self._gaps)
        appender.on_proven = self._wake
        self._led[partition] = appender
        try:
            if not await self.reads.register(partition, self.address, next_offset):
                state.supersede(
                    f"partition {partition} moved past {next_offset} before this "
                    "leader could register"
                )
        except database_errors() as exc:
            state.supersede(f"could not register as leader of partition {partition} ({exc})")

    async def folding(
        self,
        partition: int,
        items: Sequence[Positioned | DeadLetter],
        next_offset: int,
        halted: bool,
    ) -> list[Folded]:
        appender = self._led.get(partition)
        if appender is None:
            return []
        state = appender.state
        folded: list[Folded] = []
        try:
            async with appender.lock:
                if state.superseded is None and not appender.in_use():
                    state.skip(next_offset)
                elif state.superseded is None:
                    await appender.ensure_known([i for i in items if i.offset >= state.next])
                    folded = state.fold(items, next_offset)
                    state.committing(next_offset)
        except LeaderSuperseded:
            pass
        except Exception as exc:  # the projector goes on; runtimes take the direct path
            log.warning(
                "partition %d: leader stands down (%s: %s)", partition, type(exc).__name__, exc
            )
            state.supersede(f"{type(exc).__name__}: {exc}")
            folded = []
        if halted:
            state.supersede(f"partition {partition} is halted at offset {next_offset}")
        return folded

    def attach(self, wake: Callable[[int], None]) -> None:
        self._wake = wake
        for appender in self._led.values():
            appender.on_proven = wake

    def carries(self, partition: int) -> bool:
        """While runtimes ask for `partition`, this leader appends its records and hands them
        over, folded; a foreign writer's are fetched when its hint or the partition's end
        offset says they are there, or with the leader's next batch
        (`PartitionAppender._prove` fetches what lies before it)."""
        appender = self._leading(partition)
        return appender is not None and appender.in_use()

    def covered(self, partition: int) -> int | None:
        appender = self._led.get(partition)
        if appender is None or appender.proving:
            return None
        return appender.state.next

    def proven(self, partition: int, start: int) -> list[Proven] | None:
        appender = self._led.get(partition)  # superseded or not: they are the log's records
        return None if appender is None else appender.take_proven(start)

    def committed(self, partition: int, next_offset: int) -> None:
        appender = self._led.get(partition)
        if appender is not None:
            appender.state.committed_to(next_offset)

    def released(self, partition: int) -> None:
        appender = self._led.pop(partition, None)
        if appender is not None:
            appender.state.supersede(f"this process no longer projects partition {partition}")
            if self._closed:  # its registration is cleared by `close`, or goes with the lock
                self._spawn(appender.close())
            else:
                self._spawn(self._stand_down(partition, appender))

    async def _stand_down(self, partition: int, appender: PartitionAppender) -> None:
        """Answer what `appender` still holds, and clear this address from the ownership row
        unless the partition was taken again meanwhile (the same address registered anew)."""
        await appender.close()
        if partition not in self._led:
            with contextlib.suppress(*database_errors()):
                await self.reads.unregister(partition, self.address)

    # -- connections -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        self._writers.add(writer)
        out = FrameWriter(writer)
        try:
            while True:
                frame = await read_frame(reader, self.max_body)
                if frame is None:
                    return
                self._spawn(self._answer(frame, self._request(frame), out))
        except (FrameError, DecodeError) as exc:
            log.warning("closing the connection from %s: %s", peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            log.info("connection from %s ended inside a frame (%s)", peer, exc)
        finally:
            self._writers.discard(writer)
            writer.close()

    def _request(self, frame: Frame) -> Event | tuple[str, str] | _IndexAsked:
        """The event of an `APPEND` or a `RESERVE`, the (key, run_id) of a `READ`, what a
        `READ_INDEX` asks; `FrameError` (or `DecodeError`) for anything else."""
        if frame.kind is Kind.APPEND:
            return decode(frame.body)
        if frame.kind is Kind.RESERVE:
            event = decode(frame.body)
            if not isinstance(event, CallReserved):
                raise FrameError(
                    f"RESERVE request {frame.request} carries {event.type}, not a reservation"
                )
            return event
        if frame.kind is Kind.READ:
            try:
                asked = json.loads(frame.body)
                return str(asked["key"]), str(asked["run_id"])
            except (ValueError, KeyError, TypeError) as exc:
                raise FrameError(
                    f"READ request {frame.request} is not {{key, run_id}} JSON"
                ) from exc
        if frame.kind is Kind.READ_INDEX:
            return _IndexAsked.parse(frame)
        raise FrameError(f"frame kind {frame.kind.name} (request {frame.request}) is not a request")

    async def _answer(
        self, frame: Frame, request: Event | tuple[str, str] | _IndexAsked, out: FrameWriter
    ) -> None:
        try:
            if isinstance(request, _IndexAsked):
                kind, body = Kind.INDEX, await self._index(request)
            elif isinstance(request, tuple):
                kind, body = await self._read(*request)
            elif frame.kind is Kind.RESERVE:
                kind, body = await self._reserve(request, frame.body)
            else:
                answer = await self._append(request, frame.body)
                kind, body = answer.kind, _body(answer)
        except Exception as exc:
            log.exception("request %d not answered", frame.request)
            kind, body = Kind.UNAVAILABLE, f"{type(exc).__name__}: {exc}".encode()
        out.send(encode_frame(kind, frame.request, body))
        with contextlib.suppress(ConnectionError):
            await out.drain()

    async def _append(self, event: Event, data: bytes) -> Answer:
        if not runtime_may_append(event):
            return Answer(
                Kind.REFUSED,
                detail=f"{event.type} for {event.key} is not a runtime's to append; a leader "
                "appends only reservations, a runtime's outcomes, abandons and run events "
                "(operator decisions go through the API). Nothing was appended",
            )
        partition = partition_for(event.run_id, self.partitions)
        appender = self._leading(partition)
        if appender is None:
            return Answer(Kind.NOT_LEADER, detail=json.dumps({"partition": partition}))
        return await appender.submit(event, data)

    async def _read(self, key: str, run_id: str) -> tuple[Kind, bytes]:
        found = await self._known(key, run_id)
        if isinstance(found, tuple):
            return found
        return Kind.RECORD, b"" if found is None else found.model_dump_json().encode()

    async def _index(self, asked: _IndexAsked) -> bytes:
        """`READ_INDEX`: where memory ends in each asked partition this process leads (every
        record it answered lies below), and the key's record as of that end if memory vouches
        for it. Nothing is awaited between reading the record and the ends, so the record is
        the fold of the log up to its partition's end."""
        found: CallRecord | tuple[Kind, bytes] | None = (Kind.NOT_KNOWN, b"")
        if asked.key is not None and asked.run_id is not None:
            found = await self._known(asked.key, asked.run_id)
        ends = {}
        for partition in asked.partitions:
            appender = self._leading(partition)
            if appender is not None:
                ends[partition] = appender.state.next
        known = not isinstance(found, tuple)
        record = found.model_dump(mode="json") if isinstance(found, CallRecord) else None
        return json.dumps({"ends": ends, "known": known, "record": record}).encode()

    async def _reserve(self, event: Event, data: bytes) -> tuple[Kind, bytes]:
        """`RESERVE`: the key's record if it has one, else `event` appended and proven.

        Nothing guards the key between the look and the append: a reservation of the same key
        appended meanwhile (by anyone) is simply folded first, and the decider rejects the
        later one, exactly as when a runtime reads and then reserves.
        """
        found = await self._known(event.key, event.run_id, event.event_id)
        if isinstance(found, tuple):
            return found
        if found is not None:
            return Kind.RECORD, found.model_dump_json().encode()
        answer = await self._append(event, data)
        return answer.kind, _body(answer)

    async def _known(
        self, key: str, run_id: str, event_id: uuid.UUID | None = None
    ) -> CallRecord | tuple[Kind, bytes] | None:
        """The key's record as memory holds it (None: no such call), learnt from PostgreSQL
        if need be (with whether `event_id` was decided, in the same statement); or the
        answer when this leader cannot vouch for it."""
        partition = partition_for(run_id, self.partitions)
        appender = self._leading(partition)
        if appender is None:
            return Kind.NOT_LEADER, json.dumps({"partition": partition}).encode()
        appender.asked()
        state = appender.state
        try:
            state.check_current()
            await appender.learn_call(key, run_id, event_id)
            state.check_current()
            record = state.call(key)
            known = state.knows(key)
        except LeaderBehind:
            return Kind.NOT_KNOWN, b""
        except LeaderSuperseded:
            return Kind.NOT_LEADER, json.dumps({"partition": partition}).encode()
        if not known or (record is not None and record.run_id != run_id):
            return Kind.NOT_KNOWN, b""
        return record

    def _leading(self, partition: int) -> PartitionAppender | None:
        """The partition's appender while this process leads it: taken, not superseded, and
        its lease current, so a process that wakes from a stall past the lease answers nothing
        until its projector has asked PostgreSQL whether it still owns the partition."""
        appender = self._led.get(partition)
        if appender is None or appender.state.superseded is not None:
            return None
        if self._owns is not None and not self._owns(partition):
            return None
        return appender


@dataclass(frozen=True)
class _IndexAsked:
    """What a `READ_INDEX` asks: partitions, and optionally a key of a run."""

    partitions: tuple[int, ...]
    key: str | None
    run_id: str | None

    @classmethod
    def parse(cls, frame: Frame) -> _IndexAsked:
        try:
            asked = json.loads(frame.body)
            key, run_id = asked.get("key"), asked.get("run_id")
            return cls(
                tuple(int(p) for p in asked["partitions"]),
                None if key is None else str(key),
                None if run_id is None else str(run_id),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FrameError(
                f"READ_INDEX request {frame.request} is not {{partitions[, key, run_id]}} JSON"
            ) from exc


def _body(answer: Answer) -> bytes:
    if answer.kind is Kind.VERDICT and answer.verdict_json is not None:
        return answer.verdict_json.encode()
    if answer.kind is Kind.VERDICT and answer.verdict is not None:
        return answer.verdict.model_dump_json().encode()
    if answer.kind is Kind.APPENDED:
        return json.dumps({"offset": answer.offset, "reason": answer.detail}).encode()
    return answer.detail.encode()
