"""What the CLI prints for people: values, not reprs; the words of what happened; whole ids."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from click.testing import CliRunner
from rich.table import Table

from tests import builders as b
from toolledger.cli import entry, main
from toolledger.cli.executions import _summary
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.models import Event
from toolledger.events.records import CallRecord
from toolledger.projections.replay import compare
from toolledger.projections.store import LedgerSnapshot


def _folded(*events: Event) -> LedgerSnapshot:
    fold = LedgerFold()
    for offset, event in enumerate(events):
        fold.apply(Positioned(0, offset, event))
    return LedgerSnapshot(dict(fold.calls), dict(fold.runs), list(fold.history), 0)


def test_a_replay_difference_prints_values_not_python_reprs() -> None:
    """`replay --verify` once printed `datetime.datetime(2026, ...)` for a moved timestamp."""
    r = b.reserved("r1", "c1")
    live = _folded(r, b.completed(r))
    record = live.calls[r.key]
    moved = record.model_copy(update={"updated_at": record.updated_at + timedelta(seconds=1)})
    replayed = replace(live, calls={r.key: moved})
    [line] = compare(live, replayed)
    assert "datetime.datetime" not in line
    assert f"updated_at: live {record.updated_at.isoformat()} != replay " in line


def _record(**fields: object) -> CallRecord:
    r = b.reserved("r1", "c7")
    record = _folded(r, b.completed(r)).calls[r.key]
    return record.model_copy(update=fields)


def test_a_compensation_reads_as_asked_for_by_the_operator() -> None:
    """A compensated call read "settled by runtime (cli:root: ...)" although an operator had
    asked for it and the runtime only ran it."""
    compensated = _record(
        status="compensated", settled_by="runtime", operator="cli:root", reason="refund"
    )
    line = _summary(compensated)
    assert "compensation asked for by cli:root: refund" in line
    assert "settled by" not in line
    failed_undo = _record(
        operator="cli:root", reason="refund", error="compensation failed: billing said no"
    )
    assert "compensation asked for by cli:root failed: refund" in _summary(failed_undo)
    resolved = _record(settled_by="operator", operator="alice", reason="found it")
    assert "settled by operator alice: found it" in _summary(resolved)
    assert "settled by its reconcile hook" in _summary(_record(settled_by="reconcile"))


def test_an_unknown_status_lists_the_valid_ones() -> None:
    result = CliRunner().invoke(main, ["executions", "list", "--status", "bogus"])
    assert result.exit_code == 2
    assert "unknown status bogus; the statuses are started, awaiting_approval," in " ".join(
        result.output.split()
    )


def test_output_that_is_not_a_terminal_keeps_ids_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, rich cut every table to 80 columns: `tokens list | cat` showed `tok_aaaa…`."""
    monkeypatch.delenv("COLUMNS", raising=False)
    console = entry.console()
    assert not console.is_terminal
    table = Table()
    for column in ("key", "tool", "a", "b", "c", "d"):
        table.add_column(column)
    key = "a-run-id-much-longer-than-the-column-would-allow-1234567890:call-0987654321"
    tool = "billing_and_payments.issue_a_credit_to_the_customer_account"
    table.add_row(key, tool, "x" * 30, "y" * 30, "z" * 30, "w" * 30)
    with console.capture() as captured:
        console.print(table)
    assert key in captured.get() and tool in captured.get()
