"""The leader's wire format: length-prefixed frames on an asyncio stream, many in flight.

A runtime on the fast path sends a leader the very bytes it would have appended to Kafka (the
event's Avro single-object encoding, `toolledger.events.codec`) and gets the verdict back on the
same connection. Requests are answered as their batches are proven, not in the order they were
sent, so every frame carries a request id the answer repeats: one connection carries as many
requests in flight as the runtime has calls, and no answer waits behind another.

A frame is

    length   u32, big-endian: the bytes that follow (header and body)
    kind     u8, one of `Kind`
    request  u32, the request id, chosen by the sender of the request
    body     the rest: Avro bytes (`APPEND`, `RESERVE`), UTF-8 JSON or text (everything else)

Nothing here trusts the peer. A frame longer than the reader's `max_body`, shorter than its
header, or of a kind outside `Kind` raises `FrameError` before its body is looked at, and the
connection that sent it is closed by whoever reads it (the leader logs why): a stream that
carried one bad frame cannot be trusted to be in step for the next one. No new dependency: the
stdlib's `struct` and asyncio streams are all it takes.

`runtime_may_append` is the one rule of what a request may carry, read on both ends: the leader
refuses anything else, and a runtime sends anything else straight down the direct path.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from dataclasses import dataclass

from toolledger.errors import ToolLedgerError
from toolledger.events.log import DEFAULT_MAX_RECORD_BYTES
from toolledger.events.models import (
    CallAbandoned,
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallReserved,
    Event,
    RunEvent,
)

_LENGTH = struct.Struct(">I")
_HEADER = struct.Struct(">BI")
#: Room for the header and for a reply's JSON around the largest record Kafka takes.
DEFAULT_MAX_BODY = DEFAULT_MAX_RECORD_BYTES + 64 * 1024


class Kind(enum.IntEnum):
    """What a frame is. Requests go to a leader; every other kind answers one."""

    #: Request: append this event (body: its Avro bytes) and answer with its verdict.
    APPEND = 1
    #: Request: the record of a call key (body: JSON `{"key", "run_id"}`), from memory.
    READ = 2
    #: Request: reserve this call unless its key is known (body: the `CallReserved`'s Avro
    #: bytes). Answered `RECORD` with the key's record if it has one (nothing appended), else
    #: appended and answered as an `APPEND` is: the read and the reservation of a new call in
    #: one round trip.
    RESERVE = 3
    #: Request: the read index of some partitions (body: JSON `{"partitions": [...]}`, and
    #: optionally `"key"` and `"run_id"`): answered `INDEX` with where this leader's memory
    #: ends in each it leads, and the key's record from memory as of that end, if it has one
    #: (the read barrier's, `toolledger.leader.runtime_side.index`).
    READ_INDEX = 4
    #: Answer: the verdict (body: `Verdict` JSON), the fold of the log up to the event's record.
    VERDICT = 16
    #: Answer to `READ`: the call record's JSON, or an empty body for "no such call"; to
    #: `RESERVE`: the record of the key, which was known, so nothing was appended.
    RECORD = 17
    #: Answer: this process does not lead that partition (body: JSON `{"partition", "leader"}`,
    #: the leader's address if this process knows it, else null). Nothing was appended.
    NOT_LEADER = 18
    #: Answer to `APPEND`: appended and acknowledged, but the verdict could not be proven from
    #: memory (body: JSON `{"partition", "offset", "reason"}`); await it on the direct path.
    APPENDED = 19
    #: Answer: refused for good (body: the reason), e.g. an operator decision. Nothing appended.
    REFUSED = 20
    #: Answer: cannot be served now (body: the reason); nothing was appended, use the direct path.
    UNAVAILABLE = 21
    #: Answer to `READ` or `RESERVE`: this leader cannot vouch for that key now; read it on the
    #: direct path (nothing was appended).
    NOT_KNOWN = 22
    #: Answer to `READ_INDEX` (body: JSON `{"ends": {partition: next offset}, "known": bool,
    #: "record": record JSON or null}`): every record this leader answered for a partition lies
    #: below its end; `record` is the key's as of that end, when `known`.
    INDEX = 23


REQUESTS = frozenset({Kind.APPEND, Kind.READ, Kind.RESERVE, Kind.READ_INDEX})


class FrameError(ToolLedgerError):
    """A frame that breaks the format; the connection that sent it must be closed."""

    code = "bad_frame"


@dataclass(frozen=True)
class Frame:
    kind: Kind
    request: int
    body: bytes


def encode_frame(kind: Kind, request: int, body: bytes) -> bytes:
    """The bytes of one frame (`request` must fit in 32 bits)."""
    return _LENGTH.pack(_HEADER.size + len(body)) + _HEADER.pack(kind, request) + body


async def read_frame(
    reader: asyncio.StreamReader, max_body: int = DEFAULT_MAX_BODY
) -> Frame | None:
    """The next frame, or None at a clean end of the stream (between frames).

    Raises `FrameError` for a frame that is too long, too short or of an unknown kind, and
    `asyncio.IncompleteReadError` for a stream that ends inside a frame.
    """
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = _LENGTH.unpack(prefix)
    if length < _HEADER.size:
        raise FrameError(
            f"a frame of {length} bytes is shorter than its {_HEADER.size}-byte header"
        )
    if length - _HEADER.size > max_body:
        raise FrameError(
            f"a frame of {length} bytes is over the {max_body}-byte limit; nothing of it was read"
        )
    data = await reader.readexactly(length)
    kind, request = _HEADER.unpack_from(data)
    try:
        known = Kind(kind)
    except ValueError:
        raise FrameError(
            f"frame kind {kind} (request {request}) is not one this leader knows"
        ) from None
    return Frame(known, request, data[_HEADER.size :])


class FrameWriter:
    """Frames that many tasks send on one stream, written together once per loop turn.

    Every `StreamWriter.write` on an idle socket is a send syscall of its own, and on loopback
    the receiver's side of the kernel runs inside it: with 64 calls in flight, a leader that
    wrote each answer by itself spent a quarter of its CPU in those syscalls. `send` queues the
    frame and the first one of a turn schedules one write of everything queued (`call_soon`),
    so the answers proven by one batch, or the requests of many calls started in one turn, leave
    in one syscall. A frame is never delayed past the current turn of the loop.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._queued: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._write)
        self._queued.append(frame)

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark (backpressure)."""
        await self._writer.drain()

    def full(self) -> bool:
        """Whether `drain` would wait: the transport holds its high-water mark or more."""
        transport = self._writer.transport
        return transport.get_write_buffer_size() >= transport.get_write_buffer_limits()[1]

    def _write(self) -> None:
        data = b"".join(self._queued)
        self._queued.clear()
        if not self._writer.is_closing():
            self._writer.write(data)


def runtime_may_append(event: Event) -> bool:
    """Whether a runtime may send `event` to a leader: reservations, a runtime's own outcomes,
    abandons and run events, all a leader accepts (`toolledger.leader.projector_side.listener`)."""
    match event:
        case CallCompleted() | CallFailed():
            return event.source == "runtime"
        case CallReserved() | CallIndeterminate() | CallAbandoned() | RunEvent():
            return True
    return False
