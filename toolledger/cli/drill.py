"""`toolledger drill`: kill the ledger's processes on purpose and check that nothing broke.

Runs agent runs in real runtime processes against real Kafka and PostgreSQL (the
`TOOLLEDGER_*` services, else the dev stack), SIGKILLs them at named points and at random
moments, kills and freezes projectors and the reconciler meanwhile (and with `--broker-kills`
the broker), then checks the ledger
against the billing system's own count of effects and against a re-fold of the log. It prints
a summary table and exits 1 if any check was violated (the seed reproduces the kill plan).
docs/DRILLS.md says what each check proves.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolledger.cli import entry
from toolledger.cli.entry import CommandFailed, ExitStatus, configure_logging
from toolledger.drill.summary import render
from toolledger.extras import PROCESSORS, require

if TYPE_CHECKING:
    from toolledger.drill.run import DrillConfig, DrillReport


@click.command()
@click.option("--runs", default=50, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--calls-per-run", default=5, show_default=True, type=click.IntRange(min=1), help="Tool calls."
)
@click.option(
    "--kills",
    default=100,
    show_default=True,
    type=click.IntRange(min=0),
    help="Runtime workers to SIGKILL (at kill points and from outside).",
)
@click.option("--seed", default=1, show_default=True, help="Seeds every random choice.")
@click.option(
    "--workers", default=4, show_default=True, type=click.IntRange(min=1), help="At a time."
)
@click.option(
    "--spares",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Workers kept connected and idle, to take over a dead worker's runs at once.",
)
@click.option("--runs-per-worker", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--partitions", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--leader",
    type=click.Choice(["auto", "off"]),
    default="auto",
    show_default=True,
    help="The runtimes' path: the leader fast path (auto), or the direct path only (off).",
)
@click.option(
    "--projector-kill-every",
    default=8.0,
    show_default=True,
    help="Mean seconds between projector SIGKILLs (0: none).",
)
@click.option(
    "--zombie-every", default=30.0, show_default=True, help="Mean seconds between zombies."
)
@click.option(
    "--reconciler-kill-every",
    default=30.0,
    show_default=True,
    help="Mean seconds between reconciler SIGKILLs.",
)
@click.option(
    "--postgres-restarts",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Restart PostgreSQL mid-drill this often (uses a private embedded server).",
)
@click.option(
    "--broker-reset",
    is_flag=True,
    help="End with a reset of a private broker (projectors must stop, runtimes fail closed).",
)
@click.option(
    "--broker-kills",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="SIGKILL the broker mid-drill this often, restarting it on its data (uses a private "
    "Apache Kafka broker: needs java and mvn).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=None,
    help="Seconds before the drill gives up and reports a time-out [default: 600 + 2 per step "
    "(runs x (calls + 1)) + 1 per kill: 1,300 s for the defaults].",
)
@click.option("--keep", is_flag=True, help="Keep the schema, topics and the drill's files.")
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the drill's logs, kill log and billing file go [default: a temporary dir].",
)
def drill(
    runs: int,
    calls_per_run: int,
    kills: int,
    seed: int,
    workers: int,
    spares: int,
    runs_per_worker: int,
    partitions: int,
    leader: Literal["auto", "off"],
    projector_kill_every: float,
    zombie_every: float,
    reconciler_kill_every: float,
    postgres_restarts: int,
    broker_reset: bool,
    broker_kills: int,
    timeout: float | None,
    keep: bool,
    home: Path | None,
) -> None:
    """Kill runtimes, projectors and reconcilers at random points, then check the ledger."""
    require("server", "the drill (it runs reconcilers)", PROCESSORS)
    require("http", "the drill (its refund tool is an HTTP tool)")
    from toolledger.drill.run import DrillConfig

    configure_logging(logging.WARNING)
    absorbable = kill_capacity(runs, calls_per_run)
    if kills > absorbable:
        raise click.BadParameter(
            f"{kills} kills are more than {runs} runs x {calls_per_run} calls can absorb: kills "
            f"are spread over the first three quarters of the work, at most {absorbable} here "
            "(about two kills per run is what the drills are sized for)",
            param_hint="--kills",
        )
    config = DrillConfig(
        runs=runs,
        calls=calls_per_run,
        kills=kills,
        seed=seed,
        workers=workers,
        spares=spares,
        runs_per_worker=runs_per_worker,
        partitions=partitions,
        leader=leader,
        projector_kill_every=projector_kill_every,
        zombie_every=zombie_every,
        reconciler_kill_every=reconciler_kill_every,
        postgres_restarts=postgres_restarts,
        broker_reset=broker_reset,
        broker_kills=broker_kills,
        timeout=timeout,
        keep=keep,
        home=home,
    )
    console = entry.console()
    try:
        report = _run(config, console)
    except asyncio.CancelledError:
        raise CommandFailed(
            "stopped by a signal; its processes were stopped", ExitStatus.STOPPED
        ) from None
    console.print(render(report))
    if report.ok:
        console.print(f"[green]every check held[/] (seed {seed})")
        if keep or home is not None:
            console.print(f"files: {report.home}; schema {report.schema}")
        return
    names = ", ".join(c.name for c in report.violations)
    if report.dispatch.timed_out:
        console.print(
            f"[red]TIMED OUT[/] after {config.time_limit:.0f} s; checks not met: {names}. "
            f"Seed {seed}; logs in {report.home}"
        )
        sys.exit(ExitStatus.NO)
    console.print(f"[red]VIOLATED[/]: {names}. Seed {seed}; logs in {report.home}")
    sys.exit(ExitStatus.NO)


def kill_capacity(runs: int, calls: int) -> int:
    """The most kills a drill of this size can deliver: one per step (a model call or a tool
    call) in the first three quarters of the work, where the driver spreads them."""
    return (3 * runs * (calls + 1)) // 4


def _run(config: DrillConfig, console: Console) -> DrillReport:
    from toolledger.drill.run import run_drill

    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[kills]} kills"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("runs finished", total=config.runs, kills=0)

        def progress(finished: int, total: int, kills: int) -> None:
            bar.update(task, completed=finished, total=total, kills=kills)

        return asyncio.run(_until_signalled(run_drill(config, progress)))


async def _until_signalled(drill: Coroutine[object, object, DrillReport]) -> DrillReport:
    """Run the drill; SIGTERM or SIGINT cancels it, so that its cleanup still runs (every
    process it started is killed by pid, its schemas and topics dropped) before the exit."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await drill
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
