"""How long unknown calls stay unknown, per tool: an analytics job on `toolledger.subscribe`.

It reads the decided facts from the beginning (facts, never requests: a late outcome the ledger
rejected did not happen) and reports per tool how many calls were reserved, how many ended
completed or failed, how many went through `indeterminate`, who settled those (the reconciler,
an operator, a runtime's reconcile hook) and how long they stayed unknown: the median and the
worst time from the `indeterminate` record to the settlement, by the requests' own clocks.
Calls still unknown when the job catches up are counted as open.

    python -m toolledger.examples.unknowns_report   # Kafka + PostgreSQL from TOOLLEDGER_*

Without them (or with services that do not answer) it says so in one line and exits 2 or 3,
as the `toolledger` commands do.

A long wait for one tool says its reconcile hook cannot tell (or it has none) and the operator
queue is where its calls go; many unknowns say its timeout is too tight for the system it calls.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from datetime import datetime

from rich.table import Table

from toolledger.cli import entry
from toolledger.projections.facts import Fact
from toolledger.settings import load_settings
from toolledger.subscribe import subscribe
from toolledger.wiring.stack import LedgerStack

_SETTLED = {"completed", "failed"}


@dataclass
class ToolReport:
    """One tool's calls, as the facts tell them."""

    reserved: int = 0
    completed: int = 0
    failed: int = 0
    unknown: int = 0
    settled_by: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)
    open: int = 0

    @property
    def median_wait(self) -> float | None:
        return statistics.median(self.waits) if self.waits else None

    @property
    def worst_wait(self) -> float | None:
        return max(self.waits) if self.waits else None


async def unknowns_report(facts: AsyncIterable[Fact]) -> dict[str, ToolReport]:
    """Fold `facts` (accepted ones count; each key's facts arrive in log order) into reports."""
    reports: dict[str, ToolReport] = defaultdict(ToolReport)
    unknown_since: dict[str, datetime] = {}
    tool_of: dict[str, str] = {}
    async for fact in facts:
        verdict = fact.verdict
        call = verdict.call
        if not verdict.accepted or call is None:
            continue
        report = reports[call.tool]
        tool_of[call.key] = call.tool
        if verdict.event_type == "call_reserved":
            report.reserved += 1
        elif verdict.event_type == "call_indeterminate":
            report.unknown += 1
            unknown_since[call.key] = fact.occurred_at
        if call.status in _SETTLED and verdict.event_type != "call_reserved":
            report.completed += call.status == "completed"
            report.failed += call.status == "failed"
            since = unknown_since.pop(call.key, None)
            if since is not None:
                report.waits.append((fact.occurred_at - since).total_seconds())
                report.settled_by[call.settled_by or "runtime"] += 1
    for key in unknown_since:
        reports[tool_of[key]].open += 1
    return dict(reports)


def render(reports: dict[str, ToolReport]) -> Table:
    table = Table(title="unknown calls by tool")
    table.add_column("tool", no_wrap=True)
    for column in ("reserved", "completed", "failed", "unknown", "settled by"):
        table.add_column(column)
    for column in ("median wait", "worst wait", "still open"):
        table.add_column(column, justify="right")
    for tool, r in sorted(reports.items()):
        table.add_row(
            tool,
            str(r.reserved),
            str(r.completed),
            str(r.failed),
            str(r.unknown),
            ", ".join(f"{who} {n}" for who, n in sorted(r.settled_by.items())) or "-",
            "-" if r.median_wait is None else f"{r.median_wait:.1f}s",
            "-" if r.worst_wait is None else f"{r.worst_wait:.1f}s",
            str(r.open),
        )
    return table


async def main() -> None:
    stack = await LedgerStack.connect(load_settings(), create_topics=False)
    try:
        reports = await unknowns_report(subscribe(stack.facts, follow=False))
    finally:
        await stack.close()
    entry.console().print(render(reports))


def run() -> int:
    """`main`, with a missing setting or a service that did not answer said in one line (and
    the exit status of the `toolledger` commands), not as a traceback."""
    try:
        asyncio.run(main())
    except Exception as exc:
        if not entry.handled(exc):
            raise
        print(f"unknowns_report: {entry.message(exc)}", file=sys.stderr)
        return entry.exit_status(exc)
    return 0


if __name__ == "__main__":
    sys.exit(run())
