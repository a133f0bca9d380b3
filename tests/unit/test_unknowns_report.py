"""The analytics example: unknown calls per tool, computed from subscribed facts."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from tests import builders as b
from toolledger.examples.unknowns_report import render, unknowns_report
from toolledger.subscribe import subscribe
from toolledger.wiring.stack import LedgerStack


async def test_the_report_counts_unknowns_their_settlers_and_how_long_they_waited() -> None:
    stack = await LedgerStack.memory(verify_keys=b.KEYS)
    try:
        by_operator, by_hook, plain, still, late = (
            b.reserved(f"r{n}", "c1", t=0) for n in range(5)
        )
        events = [
            by_operator,
            b.indeterminate(by_operator, t=1),
            b.resolved(by_operator, 2, outcome="completed", t=91),
            by_hook,
            b.indeterminate(by_hook, t=2),
            b.found(by_hook, 2, t=32),
            plain,
            b.failed(plain, t=1),
            still,
            b.indeterminate(still, t=3),
            late,
            b.completed(late, t=1),
            b.completed(late, t=2),  # rejected (late_outcome): must not count
        ]
        for event in events:
            await stack.commands.append_and_await(event, timeout=5)
        reports = await unknowns_report(subscribe(stack.facts, follow=False, idle_timeout=0.2))
    finally:
        await stack.close()
    report = reports["billing.issue_credit"]
    assert (report.reserved, report.completed, report.failed) == (5, 3, 1)
    assert (report.unknown, report.open) == (3, 1)
    assert dict(report.settled_by) == {"operator": 1, "reconcile": 1}
    assert sorted(report.waits) == [30.0, 90.0]
    assert (report.median_wait, report.worst_wait) == (60.0, 90.0)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(reports))
    row = next(line for line in console.export_text().splitlines() if "billing" in line)
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [
        "billing.issue_credit", "5", "3", "1", "3", "operator 1, reconcile 1", "60.0s", "90.0s",
        "1",
    ]  # fmt: skip


def test_the_report_without_services_says_so_in_one_line() -> None:
    """`python -m toolledger.examples.unknowns_report` with no TOOLLEDGER_* variables printed a
    twenty-line traceback ending in ConfigError; it must say what to set, once, and exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    done = subprocess.run(
        [sys.executable, "-m", "toolledger.examples.unknowns_report"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("unknowns_report: TOOLLEDGER_DATABASE_URL")
    assert "toolledger dev up" in line
