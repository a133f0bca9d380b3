"""`toolledger resumer --app myapp.agents:resume`: resume paused runs when their wait is over.

The hook is the host's (`async def resume(run: RunRecord) -> None`, typically building an
`AgentRun` and calling `resume()`); the resumer only decides when. Run several with the same
`--group`: faust shares the facts partitions between them. Configured by `TOOLLEDGER_*`.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import click
import faust

from toolledger.events.log import TopicMissing
from toolledger.processors.app import DEFAULT_SESSION_TIMEOUT_S
from toolledger.processors.resumer import Resumer, load_hook, resumer_app
from toolledger.settings import ConfigError, load_settings
from toolledger.stack import LedgerStack


async def _run(spec: str, group: str | None, session_timeout: float) -> int:
    settings = load_settings()
    try:
        hook = load_hook(spec)
    except (ImportError, ValueError) as exc:
        click.echo(f"toolledger resumer: cannot load --app {spec}: {exc}", err=True)
        return 2
    stack = await LedgerStack.connect(settings, create_topics=False)
    try:
        try:
            partitions = await stack.facts.partition_count()
        except TopicMissing:
            click.echo(
                f"toolledger resumer: {settings.facts_topic} does not exist yet: start "
                "`toolledger projector` once against this Kafka, it creates the topics",
                err=True,
            )
            return 4
        resumer = Resumer(hook, stack.store.get_call)
        app = resumer_app(
            settings, resumer, partitions=partitions, group=group, session_timeout=session_timeout
        )
        worker = faust.Worker(app, quiet=True, redirect_stdouts=False, override_logging=False)
        worker.spinner = None
        await worker.start()
        return 1 if worker.crash_reason is not None else 0
    finally:
        await stack.close()


@click.command()
@click.option("--app", "spec", required=True, help="The resume hook, as module:function.")
@click.option("--group", default=None, help="Consumer group (default: per topic prefix).")
@click.option(
    "--session-timeout",
    default=DEFAULT_SESSION_TIMEOUT_S,
    show_default=True,
    help="Kafka group session timeout in seconds.",
)
def resumer(spec: str, group: str | None, session_timeout: float) -> None:
    """Resume paused runs when the call they wait on is settled (facts topic, faust)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
    )
    try:
        sys.exit(asyncio.run(_run(spec, group, session_timeout)))
    except ConfigError as exc:
        click.echo(f"toolledger resumer: {exc}", err=True)
        sys.exit(2)
