"""`toolledger resumer --app myapp.agents:resume`: resume paused runs when their wait is over.

The hook is the host's (`async def resume(run: RunRecord) -> None`, typically building an
`AgentRun` and calling `resume()`); the resumer only decides when, and retries a hook that
raises (`TOOLLEDGER_RESUME_MAX_ATTEMPTS`, `TOOLLEDGER_RESUME_BACKOFF_S`). Run several with the
same `--group`: faust shares the facts partitions between them. Configured by `TOOLLEDGER_*`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import click

from toolledger.cli.entry import configure_logging, run_worker
from toolledger.extras import PROCESSORS, require
from toolledger.processors import DEFAULT_SESSION_TIMEOUT_S

if TYPE_CHECKING:
    from toolledger.events.models import RunResumeFailed
    from toolledger.events.records import Verdict


async def _run(spec: str, group: str | None, session_timeout: float) -> None:
    require("server", "this command", PROCESSORS)
    from toolledger.events.log import TopicMissing
    from toolledger.processors.resumer import ResumePolicy, Resumer, load_hook, resumer_app
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
        backoff = settings.resume_backoff_s
        policy = ResumePolicy(settings.resume_max_attempts, backoff, max_backoff=60 * backoff)

        async def mark_failed(event: RunResumeFailed) -> Verdict:
            return await stack.commands.append_and_await(event, settings.verdict_timeout_s)

        resumer = Resumer(hook, stack.reads, mark_failed=mark_failed, policy=policy)
        app = resumer_app(
            settings, resumer, partitions=partitions, group=group, session_timeout=session_timeout
        )
        try:
            await run_worker(app)
        finally:
            await resumer.close()
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
@click.option(
    "--check",
    is_flag=True,
    help="Only import the hook and say whether it loads (`toolledger server` runs this first).",
)
@click.option("--group", default=None, help="Consumer group (default: per topic prefix).")
@click.option(
    "--session-timeout",
    default=DEFAULT_SESSION_TIMEOUT_S,
    show_default=True,
    help="Kafka group session timeout in seconds.",
)
def resumer(spec: str, check: bool, group: str | None, session_timeout: float) -> None:
    """Resume paused runs when the call they wait on is settled (facts topic, faust)."""
    if check:
        require("server", "this command", PROCESSORS)
        from toolledger.processors.resumer import load_hook

        load_hook(spec)
        click.echo(f"resume hook {spec} loads")
        return
    configure_logging(logging.INFO)
    asyncio.run(_run(spec, group, session_timeout))
