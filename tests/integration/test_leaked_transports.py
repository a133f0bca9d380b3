"""The suite's one allowance for leaked connections (`tests/conftest.py`) stays that narrow.

A socket transport collected after its event loop closed is reported by asyncio as
"unclosed transport": a connection left open. The suite lets that pass for a connection to its
own broker only, the trace of aiokafka's shutdown race (`_aiokafka_shutdown_race`). One to
anything else must still be reported, so a test that leaks it fails.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest


def _leak_a_connection(host: str, port: int) -> None:
    """Connect to `host:port` on a loop that is then closed with the connection still open,
    and drop every reference to it: what is left is for the collector."""
    held: list[Any] = []

    async def connect() -> None:
        _, writer = await asyncio.open_connection(host, port)
        held.append(writer)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(connect())
    finally:
        loop.close()
    held.clear()


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What asyncio reports while the collector finalizes leaked transports, as messages."""
    seen: list[str] = []

    def hook(unraisable: Any) -> None:
        seen.append(str(unraisable.exc_value))

    gc.collect()
    monkeypatch.setattr(sys, "unraisablehook", hook)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        # Only the transport's own report is under test: the socket's and the stream's are
        # covered by the suite's filters.
        warnings.filterwarnings("ignore", message="unclosed <socket", category=ResourceWarning)
        warnings.filterwarnings("ignore", message="loop is closed", category=ResourceWarning)
        yield seen


def test_a_leaked_connection_to_the_sessions_broker_is_closed_quietly(
    kafka_bootstrap: str, reported: list[str]
) -> None:
    host, _, port = kafka_bootstrap.rpartition(":")
    _leak_a_connection(host, int(port))
    gc.collect()
    assert reported == []


def test_a_leaked_connection_to_anything_else_is_still_reported(
    kafka_bootstrap: str, reported: list[str]
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        _leak_a_connection("127.0.0.1", port)
        gc.collect()
    named = f"to ('127.0.0.1', {port})"
    assert any("unclosed transport" in m and named in m for m in reported), reported
