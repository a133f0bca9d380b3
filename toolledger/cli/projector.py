"""`toolledger projector`: run a projector process until SIGTERM or SIGINT.

Run two or more: ownership of partitions goes through PostgreSQL advisory locks. By default
the first process takes every free partition and the others are hot standbys; with
`TOOLLEDGER_PROJECTOR_OWNERSHIP=share` the partitions are split evenly among the processes.
Either way the survivors take a dead process's partitions within a second (a hung one's
within about ten: PostgreSQL ends its idle transaction). A lost database connection is
survived: positions are re-read when it is back; so is a broker that stops answering (the
process stands down until it answers again). It exits non-zero with the log-identity error
when the topic is not the one the ledger was built from.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

import click

from toolledger.events.log import LogError, LogIdentityError
from toolledger.settings import ConfigError, load_settings
from toolledger.stack import LedgerStack


async def _run(status_every: float) -> None:
    settings = load_settings()
    # It waits for no verdict, so it does not LISTEN to the notifications it sends itself.
    stack = await LedgerStack.connect(settings, run_projector=True, listen=False)
    # Everything imported and connected so far lives as long as the process: keep it out of
    # every later collection (a library cannot decide this for its host; this command can).
    gc.freeze()
    projector = stack.projector
    assert projector is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, projector.stop)
    task = stack.projector_task
    log = logging.getLogger("toolledger.projector")
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=status_every)
            if not task.done():
                stats = projector.stats
                log.info(
                    "owns %s; applied %d events in %d batches; %d dead letters; %d conflicts",
                    sorted(projector.owned),
                    stats.applied,
                    stats.batches,
                    stats.dead_letters,
                    stats.conflicts,
                )
        task.result()
    finally:
        await stack.close()


@click.command()
@click.option(
    "--status-every", default=30.0, show_default=True, help="Seconds between status log lines."
)
def projector(status_every: float) -> None:
    """Fold toolledger.events into the PostgreSQL ledger (configured by TOOLLEDGER_*)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
    )
    try:
        asyncio.run(_run(status_every))
    except ConfigError as exc:
        click.echo(f"toolledger projector: {exc}", err=True)
        sys.exit(2)
    except LogIdentityError as exc:
        click.echo(f"toolledger projector: stopped: {exc}", err=True)
        sys.exit(3)
    except LogError as exc:
        click.echo(f"toolledger projector: {exc}", err=True)
        sys.exit(4)
