"""`toolledger mcp serve` as real processes on Kafka + PostgreSQL: stdio, HTTP, a kill, a race.

The children are the real command (`python -m toolledger mcp serve --tools
tests.integrations.mcp_tools`); the test process runs the projector that folds their requests
and holds the fake billing system's file, which judges every scenario by counting refunds.
HTTP servers are started by `Procs` on free ports and killed by pid; the stdio server is
started by the MCP SDK's own `stdio_client`, announces its pid on stderr, and the test checks
by that pid that it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import mcp.types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.api_support import OneProcessSettings as Settings
from tests.fake_billing import FakeBilling, use_service
from tests.integration.procs import Proc, Procs, until
from tests.integrations.mcp_support import (
    ISSUE,
    ISSUE_SLOWLY,
    ISSUE_THEN_STALL,
    REFUND,
    ROOT,
    free_port,
    serve_argv,
    serve_env,
    stack_settings,
    status,
    text,
)
from tests.isolated import Isolated, running_stack
from toolledger.events.records import CallRecord
from toolledger.integrations.mcp import call_tool_keyed
from toolledger.wiring.stack import LedgerStack

START_TIMEOUT = 60.0


@pytest.fixture
def settings(isolated: Isolated) -> Settings:
    return stack_settings(isolated)


@pytest.fixture
async def projector(settings: Settings) -> AsyncIterator[LedgerStack]:
    """This test's topics and schema, and the projector that folds the children's requests."""
    async with running_stack(settings) as stack:
        yield stack


@pytest.fixture
def billing(tmp_path: Path) -> FakeBilling:
    return use_service(FakeBilling(tmp_path / "billing.db"))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    started = Procs(tmp_path)
    try:
        yield started
    finally:
        started.close()


async def http_server(procs: Procs, name: str, settings: Settings, billing: FakeBilling) -> str:
    """Start `toolledger mcp serve --transport http` on a free port; its URL once it listens."""
    port = free_port()
    argv = serve_argv("--transport", "http", "--port", str(port))
    proc = procs.start(name, argv, serve_env(settings, billing.path))
    await proc.wait_for(r"Uvicorn running on", timeout=START_TIMEOUT)
    return f"http://127.0.0.1:{port}/mcp"


async def refund(url: str, name: str = ISSUE, call_id: str = "c1") -> types.CallToolResult:
    async with Client(url) as client:
        return await call_tool_keyed(client, name, REFUND, run_id="r1", tool_call_id=call_id)


@pytest.mark.usefixtures("projector")
async def test_over_stdio_a_resent_refund_is_made_once(
    settings: Settings, billing: FakeBilling, tmp_path: Path
) -> None:
    """A client of a stdio server resending a refund with its key must get the first refund,
    and the server process must end when the client closes."""
    errlog = tmp_path / "stdio-server.log"
    params = StdioServerParameters(
        command=serve_argv()[0],
        args=serve_argv()[1:],
        env=serve_env(settings, billing.path),
        cwd=ROOT,
    )
    pid = None
    try:
        with errlog.open("w") as err:
            async with Client(stdio_client(params, errlog=err)) as client:
                first = await call_tool_keyed(client, ISSUE, REFUND, run_id="r1", tool_call_id="c1")
                again = await call_tool_keyed(client, ISSUE, REFUND, run_id="r1", tool_call_id="c1")
                found = re.search(r"mcp serve \(pid (\d+)\)", errlog.read_text())
                assert found is not None, errlog.read_text()
                pid = int(found.group(1))
        assert status(first) == status(again) == "completed", text(first)
        assert text(again) == text(first)
        assert billing.requests() == 1
        await until(lambda: not _alive(pid), timeout=10, what=f"stdio server pid {pid} to exit")
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_a_server_killed_after_the_refund_ran_is_answered_by_a_new_one(
    settings: Settings, billing: FakeBilling, procs: Procs, projector: LedgerStack
) -> None:
    """A server SIGKILLed after the refund landed but before it answered must not cost a second
    refund: a new server asked the same key finds the refund (reconcile hook) and answers it."""
    url = await http_server(procs, "mcp-a", settings, billing)
    lost = asyncio.create_task(refund(url, ISSUE_THEN_STALL))
    await until(lambda: billing.effects("r1:c1") == 1, timeout=30, what="the refund to land")
    _by_name(procs, "mcp-a").kill()
    done, _ = await asyncio.wait({lost}, timeout=30)
    assert lost in done and lost.exception() is not None, "the client must not get an answer"

    # The reservation was answered by the partition's leader, before its projection committed
    # it: the record reaches PostgreSQL a batch later, and must then say the call started.
    async def projected() -> CallRecord | None:
        return await projector.call_reads.get("r1:c1")

    record = await until(projected, timeout=10, what="the reservation's record in PostgreSQL")
    assert record.status == "started"

    answered = await refund(await http_server(procs, "mcp-b", settings, billing), ISSUE_THEN_STALL)
    assert status(answered) == "completed", text(answered)
    credit = await billing.find_credit("r1:c1")
    assert credit is not None and answered.structured_content == credit.model_dump()
    assert billing.requests() == 1
    assert billing.effects() == 1


@pytest.mark.usefixtures("projector")
async def test_two_servers_given_one_key_at_once_make_one_refund(
    settings: Settings, billing: FakeBilling, procs: Procs
) -> None:
    """Two server processes receiving the same key at the same moment must make one refund
    between them, and both must answer with it."""
    urls = await asyncio.gather(
        http_server(procs, "mcp-a", settings, billing),
        http_server(procs, "mcp-b", settings, billing),
    )
    answers = await asyncio.gather(*(refund(url, ISSUE_SLOWLY) for url in urls))
    assert [status(a) for a in answers] == ["completed", "completed"], [text(a) for a in answers]
    assert text(answers[0]) == text(answers[1])
    assert billing.requests() == 1
    assert billing.effects() == 1


def _by_name(procs: Procs, name: str) -> Proc:
    return next(p for p in procs.started if p.name == name)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return False
