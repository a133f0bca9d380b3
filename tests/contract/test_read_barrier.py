"""Reads that see every acknowledged write: the contract, on every ledger and path.

A runtime is told how its call ended before the projection holds it (an outcome returns on
Kafka's acknowledgement; a partition leader answers from memory). Before the read barrier an
operator acting at once read PostgreSQL a batch behind: `demo --stack` got a 404 for the call it
had just made, `Operator.get` said "not found" for about 10 ms, and on the memory ledger
`compensate` right after `call` conflicted every time. So here each reader acts at once on a call
that has just returned, with no sleep, from another process where there is one (the API and
`toolledger history` are processes of their own on Kafka + PostgreSQL):

- the API's GET of the key shows the record, at the version the runtime was answered;
- `testing.Operator` finds it;
- the queue lists it;
- `toolledger history` shows both of its events;
- compensate and resolve act on the version the runtime was answered, and are accepted.

And with the projection held back, a read waits up to the bound and then says it is stale
(503 `stale_read`), never showing what it has.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from tests import api_support as s
from tests.barrier_tools import TOOLS, credit, lost_credit
from tests.integration.procs import Procs, run_toolledger_async, toolledger_env, until
from tests.isolated import Isolated
from tests.verdict_hold import VerdictHold
from toolledger import Ledger, ToolCallIndeterminate, ToolContext, Toolset, external
from toolledger.api import create_app
from toolledger.api.tokens import MemoryTokens, PostgresTokens
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.settings import OperatorSettings, ProjectorSettings
from toolledger.testing import Operator

#: The read barrier's bound (seconds): the longest a read waits for the projection.
BOUND = 2.0


class Desk(Protocol):
    """Where an operator reads and acts: the API, and `toolledger history`."""

    async def get(self, key: str) -> httpx.Response: ...
    async def queue(self, run_id: str) -> list[str]: ...
    async def history(self, key: str) -> list[str]: ...
    async def post(self, key: str, action: str, body: dict[str, Any]) -> httpx.Response: ...


class Api:
    """The operator API through `client`; the history from `history`."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get(self, key: str) -> httpx.Response:
        return await self.client.get(f"/v1/tool-executions/{key}")

    async def queue(self, run_id: str) -> list[str]:
        got = await self.client.get("/v1/tool-executions", params={"run_id": run_id})
        assert got.status_code == 200, got.text
        return [item["key"] for item in got.json()["items"]]

    async def post(self, key: str, action: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(f"/v1/tool-executions/{key}/{action}", json=body)


class ReadBarrierScenarios:
    ledger: Ledger
    desk: Desk
    signing: Any
    hold: VerdictHold

    async def call(self, tool: Any, run_id: str, call_id: str) -> Any:
        return await self.ledger.call(
            tool, run_id=run_id, tool_call_id=call_id, tenant_id="acme",
            arguments={"amount_cents": 100},
        )  # fmt: skip

    async def test_every_reader_sees_a_call_the_moment_its_runtime_was_answered(self) -> None:
        run = f"r-{uuid.uuid4().hex[:8]}"
        outcome = await self.call(credit, run, "get")
        got = await self.desk.get(f"{run}:get")
        assert got.status_code == 200, got.text
        shown = got.json()["record"]
        assert (shown["status"], shown["version"]) == ("completed", 2)
        assert outcome.value["credit"] == f"{run}:get"

        await self.call(credit, run, "operator")
        operator = Operator(self.ledger, signing_key=self.signing)
        assert (await operator.get(f"{run}:operator")).status == "completed"

        await self.call(credit, run, "queue")
        assert f"{run}:queue" in await self.desk.queue(run)

        await self.call(credit, run, "history")
        assert await self.desk.history(f"{run}:history") == ["call_reserved", "call_completed"]

        await self.call(credit, run, "undo")
        undone = await self.desk.post(f"{run}:undo", "compensate", {"reason": "asked at once"})
        assert undone.status_code == 200, undone.text
        assert undone.json()["record"]["status"] == "compensated"

        with pytest.raises(ToolCallIndeterminate) as told:
            await self.call(lost_credit, run, "lost")
        answered = told.value.record.version
        resolved = await self.desk.post(
            f"{run}:lost",
            "resolve",
            {"outcome": "failed", "reason": "not in billing", "expected_version": answered},
        )
        assert resolved.status_code == 200, resolved.text
        assert (resolved.json()["status"], resolved.json()["version"]) == ("failed", answered + 1)

    async def test_a_read_waits_for_a_held_projection_then_says_it_is_stale(self) -> None:
        """A projection that does not commit must not be read as if it had: the read waits
        the bound out and answers 503 `stale_read`, naming the partition behind; once the
        projection commits, the same read shows the call."""
        run = f"held-{uuid.uuid4().hex[:8]}"
        hold = self.hold
        held_tools = Toolset("held")

        @held_tools.tool(external(), timeout=5)
        async def held_credit(amount_cents: int, context: ToolContext) -> int:
            """Holds the projection once the request left: the outcome is appended (and
            answered) but never committed until the hold ends."""
            async with context.sending():
                hold.hold()
                return amount_cents

        try:
            await self.call(held_credit, run, "c1")
            started = time.monotonic()
            got = await self.desk.get(f"{run}:c1")
            waited = time.monotonic() - started
        finally:
            hold.release()
        assert got.status_code == 503, got.text
        assert got.json()["error"]["code"] == "stale_read"
        assert "behind" in got.json()["error"]["message"], got.text
        assert waited >= BOUND * 0.9, f"answered stale after {waited:.2f}s, not the bound"
        shown = await self.desk.get(f"{run}:c1")
        assert shown.status_code == 200, shown.text
        assert shown.json()["record"]["status"] == "completed"


class TestMemoryLedger(ReadBarrierScenarios):
    """The embedded ledger reads its own writes: no yield needed between `call` and a read."""

    @pytest.fixture(autouse=True)
    async def _ledger(self) -> AsyncIterator[None]:
        async with await Ledger.memory(s.SIGNING_KEY) as ledger:
            self.ledger, self.signing = ledger, s.SIGNING_KEY
            ledger.stack.reads.barrier.timeout = BOUND
            self.hold = VerdictHold(ledger.stack.store)
            tokens = MemoryTokens()
            app = create_app(
                ledger.stack, OperatorSettings(signing_keys=(s.SIGNING_KEY,)), tokens=tokens,
                tools=TOOLS,
            )  # fmt: skip
            async with s.client(app, await s.token(tokens)) as client:
                self.desk = MemoryDesk(client, ledger)
                yield
            self.hold.release()


class MemoryDesk(Api):
    def __init__(self, client: httpx.AsyncClient, ledger: Ledger) -> None:
        super().__init__(client)
        self.ledger = ledger

    async def history(self, key: str) -> list[str]:
        return [h.event_type for h in await self.ledger.stack.reads.history(key)]


class ProcessDesk(Api):
    """The API in a process of its own, and `toolledger history` in another."""

    def __init__(self, client: httpx.AsyncClient, env: dict[str, str]) -> None:
        super().__init__(client)
        self.env = env

    async def history(self, key: str) -> list[str]:
        code, out, err = await run_toolledger_async(self.env, "history", key)
        assert code == 0, out + err
        return [
            word
            for line in out.splitlines()
            for word in line.replace("│", " ").split()
            if word.startswith(("call_", "compensation_"))
        ]


class OnKafkaPostgres(ReadBarrierScenarios):
    leader: str

    @pytest.fixture(autouse=True)
    async def _ledger(self, isolated: Isolated, tmp_path: Path) -> AsyncIterator[None]:
        settings = isolated.settings(ProjectorSettings, verify_keys=s.KEYS, leader=self.leader)
        procs = Procs(tmp_path)
        try:
            async with await Ledger.connect(settings, run_projector=True) as ledger:
                self.ledger, self.signing = ledger, s.SIGNING_KEY
                self.hold = VerdictHold(ledger.stack.store)
                env = {
                    **toolledger_env(settings),
                    "TOOLLEDGER_SIGNING_KEYS": s.SIGNING_KEY.setting(),
                }
                port = _free_port()
                api = procs.python(
                    "api", "toolledger", "api", "--port", str(port), "--tools",
                    "tests.barrier_tools", "--log-level", "warning",
                    env={**env, "TOOLLEDGER_READ_BARRIER_TIMEOUT_S": str(BOUND)},
                )  # fmt: skip
                base = f"http://127.0.0.1:{port}"
                await until(lambda: _answers(base), timeout=30, what=f"the API ({api.output()})")
                if self.leader == "auto":
                    await self._all_led(ledger)
                tokens = PostgresTokens(isolated.database_url, isolated.schema)
                try:
                    bearer = await s.token(tokens)
                finally:
                    await tokens.close()
                headers = {"Authorization": f"Bearer {bearer}"}
                async with httpx.AsyncClient(base_url=base, headers=headers) as client:
                    self.desk = ProcessDesk(client, env)
                    yield
                self.hold.release()
                if self.leader == "auto":
                    assert isinstance(ledger.port, LeaderPort)
                    assert ledger.port.stats["leader"] > 0, "the calls took the direct path"
        finally:
            procs.close()

    async def _all_led(self, ledger: Ledger) -> None:
        port = ledger.port
        assert isinstance(port, LeaderPort)

        async def led() -> bool:
            found = await port.directory.leaders()
            return all(found.get(p) for p in range(port.partitions))

        await until(led, timeout=15, what="a leader for every partition")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _answers(base: str) -> bool:
    try:
        async with httpx.AsyncClient(base_url=base) as probe:
            return (await probe.get("/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


class TestDirectPath(OnKafkaPostgres):
    leader = "off"


class TestLeaderPath(OnKafkaPostgres):
    leader = "auto"


del ReadBarrierScenarios, OnKafkaPostgres
