"""The leader's wire format and settings, without a network.

A frame must come back as it was sent, and a frame that breaks the format must be refused
before its body is read (an oversized length would otherwise make the leader allocate it).
A bad leader setting must stop startup naming the variable, never surface later as a refused
connection.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from toolledger.errors import ConfigError
from toolledger.leader.runtime_side.frames import FrameError, Kind, encode_frame, read_frame
from toolledger.settings import load_settings


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_come_back_as_sent_in_order_and_then_a_clean_end() -> None:
    """Several frames on one stream must each come back whole, then None at the end."""
    sent = [
        (Kind.APPEND, 1, b"\xc3\x01body"),
        (Kind.READ, 2**32 - 1, b""),
        (Kind.VERDICT, 7, b"{}"),
    ]
    reader = _reader(b"".join(encode_frame(*f) for f in sent))
    got = [await read_frame(reader) for _ in sent]
    assert [(f.kind, f.request, f.body) for f in got if f is not None] == sent
    assert await read_frame(reader) is None


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (struct.pack(">I", 10_000_000), "over the"),
        (struct.pack(">I", 3) + b"abc", "shorter than"),
        (struct.pack(">IBI", 5, 99, 1), "kind 99"),
    ],
    ids=["oversized", "short", "unknown kind"],
)
async def test_a_frame_that_breaks_the_format_is_refused_before_its_body(
    data: bytes, says: str
) -> None:
    """An oversized, short or unknown frame must raise `FrameError` saying which it was."""
    with pytest.raises(FrameError, match=says):
        await read_frame(_reader(data), max_body=1024)


async def test_a_stream_cut_inside_a_frame_is_not_a_clean_end() -> None:
    """A connection that breaks mid-frame must not read as "no more requests"."""
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(_reader(encode_frame(Kind.APPEND, 1, b"0123456789")[:-3]))


@pytest.mark.parametrize(
    ("field", "value", "variable"),
    [
        ("leader_listen", "localhost", "TOOLLEDGER_LEADER_LISTEN"),
        ("leader_listen", "127.0.0.1:99999", "TOOLLEDGER_LEADER_LISTEN"),
        ("leader", "sometimes", "TOOLLEDGER_LEADER"),
        ("leader_timeout_ms", 0, "TOOLLEDGER_LEADER_TIMEOUT_MS"),
    ],
)
def test_a_bad_leader_setting_stops_startup_naming_it(
    field: str, value: object, variable: str
) -> None:
    """A leader setting that cannot work must be a `ConfigError` naming its variable."""
    overrides: dict[str, object] = {field: value}
    with pytest.raises(ConfigError, match=variable):
        load_settings(None, **overrides)


def test_the_leader_listens_on_loopback_by_default() -> None:
    """Without TLS the leader must not listen beyond this machine unless told to."""
    assert load_settings(None).leader_listen.startswith("127.0.0.1:")
