"""What the MCP tests share: one test's ledger, billing judge, MCP server and operator API.

`Harness` bundles a ledger (memory, or Kafka + PostgreSQL with an in-process projector), the
fake billing system, a `LedgerMCPServer` over `tests.integrations.mcp_tools`, and the operator
HTTP API on the same stack (tests/api_support.py), through which an operator resolves,
approves or rejects calls exactly as in production: a signed event, folded by the projector.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
from mcp import Client

from tests import api_support as s
from tests.api_support import OneProcessSettings as Settings
from tests.fake_billing import FakeBilling, use_service
from tests.integrations import mcp_tools
from tests.isolated import Isolated, child_env
from toolledger import Ledger
from toolledger.api import create_app
from toolledger.api.app import close_stack
from toolledger.api.tokens import MemoryTokens
from toolledger.integrations._common import AdapterOptions
from toolledger.integrations.mcp import LedgerMCPServer, call_tool_keyed
from toolledger.wiring.stack import LedgerStack

ROOT = Path(__file__).resolve().parents[2]
TENANT = "acme"
REFUND = {"account_id": "acct-7", "amount_cents": 2500}
#: The model-facing names of `mcp_tools.refunds`.
ISSUE = "shop__refunds__issue"
ISSUE_SLOWLY = "shop__refunds__issue_slowly"
ISSUE_THEN_STALL = "shop__refunds__issue_then_stall"
ISSUE_TIMING_OUT = "shop__refunds__issue_timing_out"
ISSUE_LARGE = "shop__refunds__issue_large"
BALANCE = "shop__refunds__balance"


def stack_settings(isolated: Isolated) -> Settings:
    return s.api_settings(**isolated.connection())


def serve_env(settings: Settings, billing_db: Path) -> dict[str, str]:
    """The environment of a `toolledger mcp serve` child on `settings`' ledger."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        **child_env(settings),
        "MCP_TEST_BILLING_DB": str(billing_db),
    }


def serve_argv(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "toolledger",
        "mcp",
        "serve",
        "--tools",
        "tests.integrations.mcp_tools",
        "--tenant",
        TENANT,
        *extra,
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Harness:
    ledger: Ledger
    billing: FakeBilling
    server: LedgerMCPServer
    api: httpx.AsyncClient

    async def call(
        self, name: str, call_id: str, arguments: Mapping[str, Any] = REFUND, run: str = "r1"
    ) -> types.CallToolResult:
        """`name` through a fresh in-process MCP client, keyed `<run>:<call_id>`."""
        async with Client(self.server.server) as client:
            return await call_tool_keyed(client, name, arguments, run_id=run, tool_call_id=call_id)

    async def decide(self, key: str, action: str, **body: Any) -> dict[str, Any]:
        """An operator's decision over the HTTP API (resolve, approve, reject)."""
        response = await self.api.post(
            f"/v1/tool-executions/{key}/{action}", json={"reason": "checked by ops", **body}
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


@asynccontextmanager
async def harness(
    stack: LedgerStack, settings: Settings, billing_db: Path, options: AdapterOptions | None = None
) -> AsyncIterator[Harness]:
    billing = use_service(FakeBilling(billing_db))
    ledger = Ledger.from_stack(stack, verdict_timeout=10)
    server = LedgerMCPServer(ledger, mcp_tools.refunds, tenant_id=TENANT, options=options)
    tokens = MemoryTokens()
    app = create_app(stack, settings, tokens=tokens)
    try:
        async with s.client(app, await s.token(tokens, tenant=TENANT)) as api:
            yield Harness(ledger, billing, server, api)
    finally:
        await ledger.close()
        await close_stack(stack)


def text(result: types.CallToolResult) -> str:
    """The text the model reads."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def status(result: types.CallToolResult) -> Any:
    return (result.meta or {}).get("dev.toolledger/status")
