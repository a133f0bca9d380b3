"""A runtime's connections to leaders, and where the leaders are.

`LeaderConnection` is one stream to one leader with any number of requests in flight: each
request gets the next request id and a future, one task reads the answers and resolves them by
id, in whatever order the leader proves them. A connection that breaks fails every request in
flight with `ConnectionError` at once, so no caller waits out its bound for an answer that
cannot come; it is then dropped and made again on the next use. A request not answered within
its bound fails with `TimeoutError`: one timer per connection rings at the earliest bound of
the requests in flight, rather than a timeout per request (an `asyncio.timeout` entered and
left for every request cost a runtime about a tenth of its CPU on the fast path).

`LeaderDirectory` says which leader holds a partition, read from the ownership rows
(`projection_offsets.leader_address`, through the `LeaderAddresses` the wiring gives it) and
kept until something says it is stale: an answer
`NOT_LEADER`, a broken connection, or a leader that did not answer in time. A partition whose
leader failed is not asked again for `retry_after` seconds; until then its calls take the
direct path, and after it the directory is read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Protocol

from toolledger.errors import LedgerUnavailable
from toolledger.leader.runtime_side.frames import (
    DEFAULT_MAX_BODY,
    Frame,
    FrameError,
    FrameWriter,
    Kind,
    encode_frame,
    read_frame,
)
from toolledger.leader.runtime_side.tls import ClientTLS, client_options

log = logging.getLogger("toolledger.leader")

#: Seconds after which a partition with no leader registered is looked up again: a projector
#: takes partitions within its ownership interval, and the first calls should not miss it long.
NO_LEADER_RECHECK = 0.25


class LeaderConnection:
    """One connection to the leader at `address` (`host:port`), many requests in flight; over
    TLS with `tls` (a handshake that fails is an `OSError`, like a refused connection)."""

    def __init__(
        self, address: str, max_body: int = DEFAULT_MAX_BODY, tls: ClientTLS | None = None
    ) -> None:
        self.address = address
        self._max_body = max_body
        self._tls = tls
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Frame]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._out: FrameWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._opening = asyncio.Lock()
        #: Each request in flight's bound (loop time), and the timer for the earliest one.
        self._bounds: dict[int, float] = {}
        self._alarm: asyncio.TimerHandle | None = None

    @property
    def broken(self) -> bool:
        return self._reading is not None and self._reading.done()

    @property
    def reached(self) -> bool:
        """Whether a connection to the leader was ever opened (else it may be unreachable)."""
        return self._reading is not None

    async def request(self, kind: Kind, body: bytes, within: float) -> Frame:
        """Send one request and return its answer; `TimeoutError` if none comes within
        `within` seconds (connecting included)."""
        loop = asyncio.get_running_loop()
        bound = loop.time() + within
        async with asyncio.timeout_at(bound) if self._out is None or self.broken else _NOTHING:
            out = await self._open()
        request = next(self._ids) & 0xFFFFFFFF
        answer: asyncio.Future[Frame] = loop.create_future()
        self._waiting[request] = answer
        self._bounds[request] = bound
        if self._alarm is None or self._alarm.when() > bound:
            self._ring_at(loop, bound)
        try:
            out.send(encode_frame(kind, request, body))
            if out.full():  # the leader is not reading: wait for room, within the bound
                async with asyncio.timeout_at(bound):
                    await out.drain()
            return await answer
        finally:
            self._waiting.pop(request, None)
            self._bounds.pop(request, None)

    def _ring_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm = loop.call_at(when, self._rang, loop)

    def _rang(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the requests past their bound; ring again at the earliest bound left."""
        self._alarm = None
        now = loop.time()
        for request, bound in list(self._bounds.items()):
            if bound <= now:
                del self._bounds[request]
                answer = self._waiting.get(request)
                if answer is not None and not answer.done():
                    answer.set_exception(
                        TimeoutError(f"the leader at {self.address} did not answer in time")
                    )
        if self._bounds:
            self._ring_at(loop, min(self._bounds.values()))

    async def _open(self) -> FrameWriter:
        async with self._opening:
            if self._out is None or self.broken:
                host, _, port = self.address.rpartition(":")
                reader, writer = await asyncio.open_connection(
                    host, int(port), **client_options(self._tls, host)
                )
                self._writer, self._out = writer, FrameWriter(writer)
                self._reading = asyncio.create_task(self._read(reader), name="toolledger-leader-in")
            return self._out

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why: BaseException = ConnectionError(f"the leader at {self.address} closed the connection")
        try:
            while (frame := await read_frame(reader, self._max_body)) is not None:
                answer = self._waiting.get(frame.request)
                if answer is not None and not answer.done():
                    answer.set_result(frame)
        except (FrameError, asyncio.IncompleteReadError, OSError) as exc:  # OSError: TLS too
            why = ConnectionError(f"the connection to the leader at {self.address} broke ({exc})")
        finally:
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(why)
            if self._writer is not None:  # a broken connection is replaced, never reused
                self._writer.close()

    async def close(self) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading


_NOTHING = contextlib.nullcontext()


class LeaderAddresses(Protocol):
    """Where the leaders are, as registered on the ownership rows."""

    async def leaders(self) -> dict[int, str | None]:
        """Every partition's registered leader address (None: no leader);
        `LedgerUnavailable` when they cannot be read."""

    async def close(self) -> None:
        """Release the connections the reads hold."""


class LeaderDirectory:
    """Which leader answers for each partition, read from PostgreSQL when stale."""

    def __init__(
        self, reads: LeaderAddresses, *, retry_after: float = 2.0, tls: ClientTLS | None = None
    ) -> None:
        self._reads = reads
        self.retry_after = retry_after
        self._tls = tls
        self._addresses: dict[int, str | None] = {}
        self._read_at = -float("inf")
        self._failed: dict[int, float] = {}
        self._connections: dict[str, LeaderConnection] = {}
        self._unreachable: set[str] = set()
        self._reached: set[str] = set()
        self._refreshing = asyncio.Lock()

    async def connection(self, partition: int) -> LeaderConnection | None:
        """The connection to `partition`'s leader, or None: take the direct path."""
        now = time.monotonic()
        known = self._addresses.get(partition) is not None
        stale = now - self._read_at >= (self.retry_after if known else NO_LEADER_RECHECK)
        failed = self._failed.get(partition)
        if failed is not None:
            if now - failed < self.retry_after:
                return None
            del self._failed[partition]
            stale = True
        if stale:
            await self._refresh()
        address = self._addresses.get(partition)
        if address is None:
            return None
        connection = self._connections.get(address)
        if connection is None or connection.broken:
            if connection is not None and connection.reached:
                self._reached.add(address)  # a leader that went away, not one out of reach
            connection = self._connections[address] = LeaderConnection(address, tls=self._tls)
        return connection

    async def leaders(self) -> dict[int, str | None]:
        """Every partition's leader as PostgreSQL says now (read again, not from memory)."""
        self._read_at = -float("inf")
        await self._refresh()
        return dict(self._addresses)

    def failed(self, partition: int, why: str, unreachable: str | None = None) -> None:
        """`partition`'s leader did not serve a request: go direct for a while, then re-read.

        `unreachable` is the registered address when no connection to it was ever opened:
        said once per address at WARNING, since it usually means the leader registered an
        address this runtime cannot reach (a container's own loopback, say), and every call
        goes direct until someone fixes it."""
        if unreachable is not None and unreachable not in self._unreachable | self._reached:
            self._unreachable.add(unreachable)
            log.warning(
                "the leader registered at %s cannot be reached from this process (%s): calls "
                "take the direct path, slower. If the projector runs on another host or in "
                "another container, set its TOOLLEDGER_LEADER_ADVERTISE to an address this "
                "process reaches it at",
                unreachable,
                why,
            )
        elif partition not in self._failed:
            log.info("partition %d: leader unavailable (%s); direct path for now", partition, why)
        self._failed[partition] = time.monotonic()

    def moved(self, partition: int) -> None:
        """`partition`'s leader says it is not the leader: read the directory again."""
        self._read_at = -float("inf")
        self._addresses.pop(partition, None)

    async def _refresh(self) -> None:
        async with self._refreshing:
            if time.monotonic() - self._read_at < 0.05:
                return
            try:
                self._addresses = await self._reads.leaders()
            except LedgerUnavailable as exc:
                log.info("cannot read where the leaders are (%s); direct path for now", exc)
                self._addresses = {}
            self._read_at = time.monotonic()

    async def close(self) -> None:
        for connection in self._connections.values():
            await connection.close()
        self._connections.clear()
        await self._reads.close()
