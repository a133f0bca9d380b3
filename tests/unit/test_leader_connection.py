"""A runtime's connection to a leader bounds each request without a timeout per request.

`LeaderConnection.request` fails with `TimeoutError` once its bound passes without an answer,
from one timer per connection set at the earliest bound in flight. These run it against a
leader stand-in on loopback that answers only the requests it is told to, when told to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from toolledger.leader.runtime_side.connection import LeaderConnection
from toolledger.leader.runtime_side.frames import Kind, encode_frame, read_frame


class _Leader:
    """Reads requests; answers one (echoing its body) when `answer(body)` is called."""

    def __init__(self, expected: int) -> None:
        self.requests: dict[bytes, int] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.expected = expected
        self.arrived = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        try:
            while (frame := await read_frame(reader)) is not None:
                self.requests[frame.body] = frame.request
                if len(self.requests) >= self.expected:
                    self.arrived.set()
        finally:
            writer.close()

    def answer(self, body: bytes) -> None:
        assert self.writer is not None
        self.writer.write(encode_frame(Kind.RECORD, self.requests[body], body))


@asynccontextmanager
async def _connected(expected: int) -> AsyncIterator[tuple[_Leader, LeaderConnection]]:
    leader = _Leader(expected)
    server = await asyncio.start_server(leader.serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    connection = LeaderConnection(f"{host}:{port}")
    try:
        yield leader, connection
    finally:
        await connection.close()
        server.close()
        await server.wait_closed()


async def test_a_request_not_answered_within_its_bound_fails_and_spares_the_others() -> None:
    """A leader that answers one request and not another: the unanswered one must fail with
    `TimeoutError` at its bound (the runtime then goes direct), while the one answered later,
    with a longer bound, still gets its answer on the same connection."""
    async with _connected(2) as (leader, connection):
        slow = asyncio.create_task(connection.request(Kind.READ, b"later", 5.0))
        with pytest.raises(TimeoutError):
            await connection.request(Kind.READ, b"never", 0.05)
        assert set(leader.requests) == {b"later", b"never"}
        leader.answer(b"later")
        frame = await asyncio.wait_for(slow, 5)
        assert (frame.kind, frame.body) == (Kind.RECORD, b"later")


async def test_requests_answered_in_time_are_answered_and_left_unbounded() -> None:
    """Many requests answered well within their bound: each gets its own answer, and none of
    them is left with a bound for the connection's timer to fail later."""
    async with _connected(20) as (leader, connection):
        asked = [
            asyncio.create_task(connection.request(Kind.READ, b"%d" % n, 5.0)) for n in range(20)
        ]
        await asyncio.wait_for(leader.arrived.wait(), 5)
        for n in range(20):
            leader.answer(b"%d" % n)
        frames = await asyncio.wait_for(asyncio.gather(*asked), 5)
        assert [f.body for f in frames] == [b"%d" % n for n in range(20)]
        assert connection._bounds == {}
