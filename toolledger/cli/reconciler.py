"""`toolledger reconciler --tools mypkg.tools`: run the reconcile driver until SIGTERM or SIGINT.

It imports the given modules, collects every `Toolset` and `Tool` in them, and asks their
reconcile hooks about the ledger's unknown calls (`toolledger.processors.reconciler`). Run as
many as you like with the same `--group`: faust shares the facts partitions between them, and
the decider's compare-and-set makes any overlap harmless. Each process needs the same tool
modules, PostgreSQL (to read verdicts) and Kafka, configured by `TOOLLEDGER_*`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from toolledger.cli.entry import CommandFailed, ExitStatus, configure_logging, run_worker
from toolledger.extras import PROCESSORS, require
from toolledger.processors import DEFAULT_SESSION_TIMEOUT_S

if TYPE_CHECKING:
    from toolledger.processors.schedule import ReconcilePolicy

log = logging.getLogger("toolledger.reconciler")


def _policies(default: ReconcilePolicy, overrides: tuple[str, ...]) -> dict[str, ReconcilePolicy]:
    from toolledger.processors.schedule import ReconcilePolicy

    policies: dict[str, ReconcilePolicy] = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit() or int(value) < 1:
            raise click.BadParameter(
                f"{item!r}: expected TOOL=N with a positive N, e.g. billing.issue_credit=3",
                param_hint="--tool-max-attempts",
            )
        policies[name] = ReconcilePolicy(
            max_attempts=int(value),
            backoff=default.backoff,
            max_backoff=default.max_backoff,
            lease=default.lease,
        )
    return policies


async def _run(
    modules: list[str],
    policy: ReconcilePolicy,
    policies: dict[str, ReconcilePolicy],
    *,
    group: str | None,
    session_timeout: float,
    scan_every: float,
    concurrency: int,
) -> None:
    require("server", "this command", PROCESSORS)
    from toolledger import telemetry
    from toolledger.events.log import TopicMissing
    from toolledger.processors.reconciler import Reconciler, collect_tools, reconciler_app
    from toolledger.settings import load_settings
    from toolledger.wiring.stack import LedgerStack
    from toolledger.wiring.stack_port import StackPort

    settings = load_settings()
    tools = collect_tools(modules)
    hooked = sorted(name for name, tool in tools.items() if tool.reconcile is not None)
    log.info("tools with a reconcile hook: %s", ", ".join(hooked) or "none")
    for name in policies:
        if name not in tools:
            raise CommandFailed(
                f"--tool-max-attempts names {name}, which no given module declares",
                ExitStatus.USAGE,
            )
    stack = await LedgerStack.connect(settings, create_topics=False)
    reconciler = None
    try:
        try:
            partitions = await stack.facts.partition_count()
            events = await stack.events.partition_count()
        except TopicMissing as exc:
            raise TopicMissing(
                f"{settings.facts_topic} or {settings.events_topic} does not exist yet: start "
                "`toolledger projector` once against this Kafka, it creates the topics"
            ) from exc
        if partitions != events:
            raise CommandFailed(
                f"{settings.facts_topic} has {partitions} partitions but {settings.events_topic} "
                f"has {events}; the facts topic must be partitioned like the events topic",
                ExitStatus.LOG_MISMATCH,
            )
        reconciler = Reconciler(
            tools,
            StackPort(stack),
            read_call=stack.reads.get_call,
            read_history=stack.reads.history if telemetry.tracing_enabled() else None,
            policy=policy,
            policies=policies,
            verdict_timeout=settings.verdict_timeout_s,
            concurrency=concurrency,
        )
        app = reconciler_app(
            settings,
            reconciler,
            partitions=partitions,
            group=group,
            session_timeout=session_timeout,
            scan_every=scan_every,
        )
        await run_worker(app)
    finally:
        if reconciler is not None:
            await reconciler.close()
        await stack.close()


@click.command()
@click.option(
    "--tools",
    "tool_modules",
    multiple=True,
    required=True,
    metavar="MODULE",
    help="Module declaring the Toolsets/Tools whose hooks to ask (repeatable, or comma-separated); "
    "it must be importable here: installed, or a package under the working directory. Every "
    "reconciler of one --group must load the same modules: the group splits the partitions "
    "between its members, and a member that lacks a tool leaves that tool's unknown calls in "
    "its partitions to an operator.",
)
@click.option(
    "--max-attempts",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Unknowns after which a call is left to an operator.",
)
@click.option(
    "--tool-max-attempts",
    multiple=True,
    metavar="TOOL=N",
    help="--max-attempts for one tool (repeatable), e.g. billing.issue_credit=3.",
)
@click.option(
    "--backoff",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between the first and second question; doubles after each unknown.",
)
@click.option(
    "--max-backoff",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Longest wait between two questions (s).",
)
@click.option(
    "--lease",
    default=None,
    type=click.FloatRange(min=0),
    help="Seconds after which a started call is looked up [default: its deadline + 5 s].",
)
@click.option(
    "--group",
    default=None,
    help="Consumer group and table namespace [default: <topic prefix>toolledger.reconciler]. "
    "Processes of one group share the work.",
)
@click.option(
    "--session-timeout",
    default=DEFAULT_SESSION_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Kafka consumer-group session timeout (s): how fast a dead process's partitions move.",
)
@click.option(
    "--scan-every", default=0.5, show_default=True, help="Seconds between scans of the table."
)
@click.option(
    "--concurrency",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Hooks asked at the same time.",
)
def reconciler(
    tool_modules: tuple[str, ...],
    max_attempts: int,
    tool_max_attempts: tuple[str, ...],
    backoff: float,
    max_backoff: float,
    lease: float | None,
    group: str | None,
    session_timeout: float,
    scan_every: float,
    concurrency: int,
) -> None:
    """Settle unknown calls with their tools' reconcile hooks (configured by TOOLLEDGER_*).

    Run several with the same --group (the default one included) and the same --tools: they
    share the facts partitions, so each must be able to ask every tool's hook. Reconcilers
    with other tools belong in another --group.
    """
    from toolledger.processors.schedule import ReconcilePolicy

    configure_logging(logging.INFO)
    modules = [m.strip() for item in tool_modules for m in item.split(",") if m.strip()]
    try:
        policy = ReconcilePolicy(
            max_attempts=max_attempts,
            backoff=timedelta(seconds=backoff),
            max_backoff=timedelta(seconds=max(max_backoff, backoff)),
            lease=None if lease is None else timedelta(seconds=lease),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    policies = _policies(policy, tool_max_attempts)
    asyncio.run(
        _run(
            modules,
            policy,
            policies,
            group=group,
            session_timeout=session_timeout,
            scan_every=scan_every,
            concurrency=concurrency,
        )
    )
