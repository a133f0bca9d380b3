"""`toolledger analytics --metrics-port 9464`: calls by status and per-minute rates, as metrics.

Runs the faust analytics app (`toolledger.processors.analytics`) over the facts topic and serves
its Prometheus metrics on the given port. Several processes with the same `--group` share the
facts partitions; sum their series in Prometheus. Configured by `TOOLLEDGER_*`.
"""

from __future__ import annotations

import asyncio
import logging

import click

from toolledger.cli.entry import configure_logging, run_worker
from toolledger.extras import PROCESSORS, require
from toolledger.processors import DEFAULT_SESSION_TIMEOUT_S


async def _run(port: int, group: str | None, session_timeout: float) -> None:
    require("server", "this command", PROCESSORS)
    from prometheus_client import start_http_server

    from toolledger.events.log import TopicMissing
    from toolledger.processors.analytics import Metrics, analytics_app
    from toolledger.settings import load_settings
    from toolledger.wiring.stack import LedgerStack

    settings = load_settings()
    stack = await LedgerStack.connect(settings, create_topics=False)
    try:
        try:
            partitions = await stack.facts.partition_count()
        except TopicMissing as exc:
            raise TopicMissing(
                f"{settings.facts_topic} does not exist yet: start `toolledger projector` once "
                "against this Kafka, it creates the topics"
            ) from exc
    finally:
        await stack.close()
    metrics = Metrics()
    start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    app = analytics_app(
        settings, metrics, partitions=partitions, group=group, session_timeout=session_timeout
    )
    await run_worker(app)


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
    configure_logging(logging.INFO)
    asyncio.run(_run(metrics_port, group, session_timeout))
