"""`toolledger resumer --app myapp.agents:resume`: resume paused runs when their wait is over.

The hook is the host's (`async def resume(run: RunRecord) -> None`, typically building an
`AgentRun` and calling `resume()`); the resumer only decides when. Run several with the same
`--group`: faust shares the facts partitions between them. Configured by `TOOLLEDGER_*`.
"""

from __future__ import annotations

import asyncio
import logging

import click

from toolledger.cli.entry import configure_logging, run_worker
from toolledger.extras import PROCESSORS, require
from toolledger.processors import DEFAULT_SESSION_TIMEOUT_S


async def _run(spec: str, group: str | None, session_timeout: float) -> None:
    require("server", "this command", PROCESSORS)
    from toolledger.events.log import TopicMissing
    from toolledger.processors.resumer import Resumer, load_hook, resumer_app
    from toolledger.settings import load_settings
    from toolledger.wiring.stack import LedgerStack

    settings = load_settings()
    hook = load_hook(spec)
    stack = await LedgerStack.connect(settings, create_topics=False)
    try:
        try:
            partitions = await stack.facts.partition_count()
        except TopicMissing as exc:
            raise TopicMissing(
                f"{settings.facts_topic} does not exist yet: start `toolledger projector` once "
                "against this Kafka, it creates the topics"
            ) from exc
        resumer = Resumer(hook, stack.reads.get_call)
        app = resumer_app(
            settings, resumer, partitions=partitions, group=group, session_timeout=session_timeout
        )
        await run_worker(app)
    finally:
        await stack.close()


@click.command()
@click.option(
    "--app",
    "spec",
    required=True,
    help="The resume hook, as module:function; the module must be importable here: installed, "
    "or a package under the working directory.",
)
@click.option("--group", default=None, help="Consumer group (default: per topic prefix).")
@click.option(
    "--session-timeout",
    default=DEFAULT_SESSION_TIMEOUT_S,
    show_default=True,
    help="Kafka group session timeout in seconds.",
)
def resumer(spec: str, group: str | None, session_timeout: float) -> None:
    """Resume paused runs when the call they wait on is settled (facts topic, faust)."""
    configure_logging(logging.INFO)
    asyncio.run(_run(spec, group, session_timeout))
