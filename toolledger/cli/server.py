"""`toolledger server`: the projector, the reconciler, the resumer and the operator API with its
console, as one command (`toolledger.server.serve` says how they share, start and stop).

Each role still runs alone (`toolledger projector`, `reconciler`, `resumer`, `api`), with the
same settings; this command is the one thing to deploy and to stop.
"""

from __future__ import annotations

import asyncio
import logging

import click

from toolledger.cli.entry import configure_logging
from toolledger.extras import require


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the API listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--tools",
    "tools",
    multiple=True,
    envvar="TOOLLEDGER_TOOLS",
    metavar="MODULE",
    help="Module declaring your Toolsets (repeatable): the reconciler asks their reconcile hooks "
    "and the API runs their compensations. Without it no reconciler runs [env TOOLLEDGER_TOOLS].",
)
@click.option(
    "--resume-app",
    default=None,
    envvar="TOOLLEDGER_RESUME_APP",
    metavar="MODULE:FUNCTION",
    help="The resume hook of paused runs, as for `toolledger resumer --app`. Without it no "
    "resumer runs [env TOOLLEDGER_RESUME_APP].",
)
@click.option(
    "--status-every", default=30.0, show_default=True, help="Seconds between status log lines."
)
@click.option("--log-level", default="info", show_default=True, help="uvicorn's log level.")
def server(
    host: str,
    port: int,
    tools: tuple[str, ...],
    resume_app: str | None,
    status_every: float,
    log_level: str,
) -> None:
    """Run every server role: projector, reconciler, resumer, API and console (TOOLLEDGER_*)."""
    require("server", "this command")
    from toolledger.server.serve import ServerOptions, serve

    configure_logging(logging.INFO)
    modules = tuple(m.strip() for item in tools for m in item.split(",") if m.strip())
    options = ServerOptions(
        host=host,
        port=port,
        tools=modules,
        resume_app=resume_app or None,
        status_every=status_every,
        log_level=log_level,
    )
    asyncio.run(serve(options))
