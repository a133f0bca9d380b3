"""The summary table a drill prints: what was done to the ledger, and what held.

Two tables: the drill (runs, kills by point, the other troubles, effects, duplicates, unknowns
and who settled them), then the checks, one row each with its evidence. `plain_summary` renders
both as plain text for docs and test failures.
"""

from __future__ import annotations

import io
import statistics
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table

from toolledger.drill.killpoints import EXTERNAL, KILL_POINTS

if TYPE_CHECKING:
    from toolledger.drill.chaos import ChaosTally
    from toolledger.drill.run import DrillReport


def drill_table(report: DrillReport) -> Table:
    c, d, ch, t = report.config, report.dispatch, report.chaos, report.tally
    table = Table(
        title=f"toolledger drill: {c.runs} runs x {c.calls} calls, seed {c.seed}",
        show_header=True,
        title_justify="left",
    )
    table.add_column("what")
    table.add_column("count", justify="right")
    finished = sum(1 for s in d.finished.values() if s == "completed")
    table.add_row("runs finished", f"{finished} of {c.runs}")
    table.add_row("  replaced (died before their prompt was saved)", str(len(d.replaced)))
    table.add_row("  driven by two runtimes at once", str(d.double_drives))
    table.add_row("  runtime workers started", str(d.workers_started))
    results = ", ".join(f"{n} {s}" for s, n in sorted(d.results.items()))
    table.add_row("  worker run results", results or "-")
    table.add_row(f"runtime path (TOOLLEDGER_LEADER={c.leader})", "")
    table.add_row("  verdicts answered by a leader", str(t.heard["leader"]))
    table.add_row("  verdicts answered by the direct path", str(t.heard["direct"]))
    table.add_row("runtime kills (SIGKILL)", str(sum(d.kills.values())))
    for point in (*KILL_POINTS, EXTERNAL, "unattributed"):
        if point != "unattributed" or d.kills[point]:
            table.add_row(f"  {point}", str(d.kills[point]))
    leaders = " and leader" if c.leader == "auto" else ""
    for where in ("between batches", "inside a batch"):
        table.add_row(f"projector{leaders} kills, {where}", str(ch.projector_kills[where]))
    table.add_row(f"zombie projectors{leaders}s (frozen, sessions ended, resumed)", str(ch.zombies))
    table.add_row("reconciler kills", str(ch.reconciler_kills))
    table.add_row("LISTEN sessions killed", str(ch.listen_kills))
    if c.postgres_restarts:
        table.add_row("PostgreSQL restarts", str(ch.postgres_restarts))
    if c.broker_kills:
        table.add_row(
            "broker kills (SIGKILL, restarted on its data)", str(len(ch.broker_recoveries))
        )
        table.add_row("  recovery to an acknowledged produce, p50 / max", _recovery(ch))
    table.add_row("acknowledged events checked in the log", str(report.acknowledged_checked))
    table.add_row("events re-appended (producer retries)", str(report.duplicates_appended))
    table.add_row("poison records", str(len(ch.poison)))
    table.add_row("calls (ledger keys)", f"{t.keys}: {t.completed} completed, {t.failed} failed")
    table.add_row(
        "billing requests (the payments API's included)",
        f"{t.requests} ({t.refused} refused: voided keys)",
    )
    table.add_row("effects (credits)", str(t.effects))
    by_tool = ", ".join(f"{n} {tool}" for tool, n in sorted(t.effects_by_tool.items()))
    table.add_row("  by tool", by_tool or "-")
    table.add_row("  refunds settled by resending (billing's replays)", f"{t.resent} ({t.lookups})")
    table.add_row("duplicate effects (must be 0)", str(t.duplicates))
    table.add_row("unknowns (no outcome from their runtime in time)", str(t.unknowns))
    table.add_row("  of which the runtime reported indeterminate", str(t.indeterminate))
    table.add_row("  settled by the reconciler", str(t.settled["reconciler"]))
    table.add_row("  settled by a resuming runtime's hook", str(t.settled["resume"]))
    table.add_row("  settled by the operator", str(t.settled["operator"]))
    table.add_row("  settled late by their own runtime", str(t.settled["late runtime"]))
    table.add_row("  still unsettled", str(t.unsettled))
    verify = next((k for k in report.checks if "re-fold" in k.name), None)
    table.add_row(
        "verify (ledger == re-fold of the log)",
        "-" if verify is None else ("identical" if verify.ok else "DIFFERENT"),
    )
    table.add_row("duration", f"{report.duration:.0f} s")
    return table


def checks_table(report: DrillReport) -> Table:
    table = Table(title="checks", title_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("evidence", overflow="fold")
    for check in report.checks:
        table.add_row(check.name, "ok" if check.ok else check.failed_as, check.detail)
    return table


def render(report: DrillReport) -> Group:
    return Group(drill_table(report), checks_table(report))


def plain_summary(report: DrillReport, width: int = 140) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(render(report))
    return console.export_text()


def _recovery(chaos: ChaosTally) -> str:
    times = sorted(chaos.broker_recoveries)
    if not times:
        return "-"
    return f"{statistics.median(times):.1f} s / {times[-1]:.1f} s"
