"""`toolledger projector`: run a projector process until SIGTERM or SIGINT.

Run two or more: ownership of partitions goes through PostgreSQL advisory locks. By default
the first process takes every free partition and the others are hot standbys; with
`TOOLLEDGER_PROJECTOR_OWNERSHIP=share` the partitions are split evenly among the processes.
Either way the survivors take a dead process's partitions within a second, and a hung one's
within its lease (`TOOLLEDGER_OWNER_LEASE_S`, 10 s: PostgreSQL ends its lock session once it
stops renewing; it needs PostgreSQL 14 or later and refuses 13, exiting 2). A lost database
connection is survived: positions are re-read when it is back; so is a broker that stops
answering (the process stands down until it answers again). It exits 4 with the log-identity
error when the topic is not the one the ledger was built from. It refuses to start without
`TOOLLEDGER_VERIFY_KEYS`, or with keys that lack or contradict the ones this ledger's projectors
registered (docs/security.md); an operator event signed with a key id it does not know halts
that partition until the key is deployed.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import click

from toolledger.cli.entry import configure_logging


async def _run(status_every: float, health_host: str, health_port: int | None) -> None:
    from toolledger.projections.gc_pause import settle_collector
    from toolledger.projections.health import ProjectorHealth, log_status
    from toolledger.projections.health_http import HealthServer
    from toolledger.settings import ProjectorSettings, load_settings
    from toolledger.wiring.stack import LedgerStack

    settings = load_settings(ProjectorSettings)
    settings.require_verify_keys()
    # It waits for no verdict, so it does not LISTEN to the notifications it sends itself.
    stack = await LedgerStack.connect(settings, run_projector=True, listen=False)
    # Everything imported and connected so far lives as long as the process: keep it out of
    # every later collection, and a leader's memory too once it outlived one.
    settle_collector()
    projector = stack.projector
    assert projector is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, projector.stop)
    health = ProjectorHealth(projector, stack.events)
    served = HealthServer(health, stack.projector_task)
    try:
        if health_port is not None:
            await served.start(health_host, health_port)
        await log_status(health, stack.projector_task, status_every)
    finally:
        await served.close()
        await stack.close()


@click.command()
@click.option(
    "--status-every", default=30.0, show_default=True, help="Seconds between status log lines."
)
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /healthz, /readyz (503 while a partition is halted or its owner stopped renewing "
    "its lease) and /metrics on this port "
    "[default: not served].",
)
@click.option("--health-host", default="127.0.0.1", show_default=True, help="Address for them.")
def projector(status_every: float, health_port: int | None, health_host: str) -> None:
    """Fold toolledger.events into the PostgreSQL ledger (configured by TOOLLEDGER_*)."""
    configure_logging(logging.INFO)
    asyncio.run(_run(status_every, health_host, health_port))
