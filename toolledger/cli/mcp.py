"""`toolledger mcp serve`: an MCP server whose tools go through the ledger.

`--tools` names the modules declaring the toolsets to serve (as for `toolledger api`); every
tool is listed under its model-facing name (`billing.issue_credit` as `billing__issue_credit`).
The ledger is Kafka + PostgreSQL from `TOOLLEDGER_*` (a missing setting stops startup naming
it); this process runs no projector (run `toolledger projector` alongside). `--memory` uses the
embedded ledger instead, which lives and dies with this process: for trying a client out, never
for calls that must happen once across a restart.

Over stdio the protocol owns stdout, so everything this command says goes to stderr.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from typing import Any, Literal

import click

from toolledger.errors import ConfigError
from toolledger.settings import Settings, load_settings


@click.group()
def mcp() -> None:
    """Serve toolsets to MCP clients, each call made once through the ledger."""


@mcp.command()
@click.option(
    "--tools",
    "tools",
    multiple=True,
    required=True,
    envvar="TOOLLEDGER_TOOLS",
    help="Module declaring the toolsets to serve (repeatable) [env TOOLLEDGER_TOOLS].",
)
@click.option(
    "--tenant",
    required=True,
    envvar="TOOLLEDGER_MCP_TENANT",
    help="The tenant every call of this server belongs to [env TOOLLEDGER_MCP_TENANT].",
)
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio (one client, the parent process) or streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--duplicate-intent",
    type=click.Choice(["hold", "allow"]),
    default="hold",
    show_default=True,
    help="A new call id repeating an unsettled call's tool and arguments: hold it, or run it.",
)
@click.option(
    "--memory",
    is_flag=True,
    help="Use the embedded ledger (gone when this process ends) instead of Kafka + PostgreSQL.",
)
def serve(
    tools: tuple[str, ...],
    tenant: str,
    transport: Literal["stdio", "http"],
    host: str,
    port: int,
    duplicate_intent: Literal["hold", "allow"],
    memory: bool,
) -> None:
    """Serve the tools of --tools over MCP, each call keyed by its request's `_meta`.

    See docs/integrations/mcp.md for the `_meta` keys and what a client is told.
    """
    from toolledger.api.compensation import load_tools

    try:
        settings = load_settings()
        if not memory:
            settings.require_services()
        registry = load_tools(tools)
        importlib.import_module("toolledger.integrations.mcp")  # without the extra: say so now
    except (ConfigError, ValueError, ImportError) as exc:
        click.echo(f"toolledger mcp serve: {exc}", err=True)
        sys.exit(2)
    if memory:
        click.echo(
            "toolledger mcp serve: embedded memory ledger; nothing recorded outlives this process",
            err=True,
        )
    asyncio.run(_serve(settings, registry, tenant, transport, host, port, duplicate_intent, memory))


async def _serve(
    settings: Settings,
    registry: dict[str, Any],
    tenant: str,
    transport: Literal["stdio", "http"],
    host: str,
    port: int,
    duplicate_intent: Literal["hold", "allow"],
    memory: bool,
) -> None:
    from toolledger import Ledger
    from toolledger.integrations._common import AdapterOptions
    from toolledger.integrations.mcp import LedgerMCPServer

    if memory:
        ledger = await Ledger.memory()
    else:
        ledger = await Ledger.connect(settings)
    async with ledger:
        server = LedgerMCPServer(
            ledger,
            registry.values(),
            tenant_id=tenant,
            options=AdapterOptions(duplicate_intent=duplicate_intent),
        )
        names = ", ".join(name for name, _ in server.names.items())
        where = "stdio" if transport == "stdio" else f"http://{host}:{port}/mcp"
        click.echo(
            f"toolledger mcp serve (pid {os.getpid()}): tenant {tenant}, {where}, tools {names}",
            err=True,
        )
        if transport == "stdio":
            await server.run_stdio()
        else:
            await server.run_http(host, port)
