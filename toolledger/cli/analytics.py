"""`toolledger analytics --metrics-port 9464`: calls by status and per-minute rates, as metrics.

Runs the faust analytics app (`toolledger.processors.analytics`) over the facts topic and serves
its Prometheus metrics on the given port. Several processes with the same `--group` share the
facts partitions; sum their series in Prometheus. Configured by `TOOLLEDGER_*`.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import click
import faust
from prometheus_client import start_http_server

from toolledger.events.log import TopicMissing
from toolledger.processors.analytics import Metrics, analytics_app
from toolledger.processors.app import DEFAULT_SESSION_TIMEOUT_S
from toolledger.settings import ConfigError, load_settings
from toolledger.stack import LedgerStack


async def _run(port: int, group: str | None, session_timeout: float) -> int:
    settings = load_settings()
    stack = await LedgerStack.connect(settings, create_topics=False)
    try:
        try:
            partitions = await stack.facts.partition_count()
        except TopicMissing:
            click.echo(
                f"toolledger analytics: {settings.facts_topic} does not exist yet: start "
                "`toolledger projector` once, it creates the topics",
                err=True,
            )
            return 4
    finally:
        await stack.close()
    metrics = Metrics()
    start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    app = analytics_app(
        settings, metrics, partitions=partitions, group=group, session_timeout=session_timeout
    )
    worker = faust.Worker(app, quiet=True, redirect_stdouts=False, override_logging=False)
    worker.spinner = None
    await worker.start()
    return 1 if worker.crash_reason is not None else 0


@click.command()
@click.option("--metrics-port", default=9464, show_default=True, help="Prometheus port.")
@click.option("--group", default=None, help="Consumer group (default: per topic prefix).")
@click.option(
    "--session-timeout",
    default=DEFAULT_SESSION_TIMEOUT_S,
    show_default=True,
    help="Kafka group session timeout in seconds.",
)
def analytics(metrics_port: int, group: str | None, session_timeout: float) -> None:
    """Count calls by tenant, tool and status; rate unknown and compensated calls per minute."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
    )
    try:
        sys.exit(asyncio.run(_run(metrics_port, group, session_timeout)))
    except ConfigError as exc:
        click.echo(f"toolledger analytics: {exc}", err=True)
        sys.exit(2)
