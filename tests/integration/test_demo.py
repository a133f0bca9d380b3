"""The demo a new user runs first must show each scenario ending the way the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _demo(*args: str, columns: str | None = "160") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env.pop("COLUMNS", None)
    return subprocess.run(
        [sys.executable, "-m", "toolledger", "demo", *args],
        cwd=ROOT,
        env=env if columns is None else {**env, "COLUMNS": columns},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_billing_demo_settles_each_scenario_as_documented() -> None:
    """1: found by the reconcile hook; 2: failed by an operator over HTTP; 3: compensated on an
    operator's request; 4: refused before sending, failed and not attempted."""
    shown = _demo()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert "scenario 1: completed/reconcile" in lines
    assert "scenario 2: failed/operator alice" in lines
    assert "scenario 3: compensated/asked for by operator alice" in lines
    assert "scenario 4: failed/runtime" in lines
    assert "POST .../demo-run:credit-2/resolve -> 200" in shown.stdout
    assert "POST .../demo-run:credit-3/compensate -> 200" in shown.stdout
    assert "live credits in billing: 1" in lines


def test_the_demo_names_keys_one_way_shows_reasons_and_prints_each_outcome_once() -> None:
    """A newcomer read "history of credit-2" above "ledger record demo-run:credit-2", no
    operator's reason anywhere, each outcome twice, and "live credits: 1 (requests sent: 3)"
    with nothing saying why."""
    out = _demo().stdout
    for n in "1234":
        assert f"history of demo-run:credit-{n}" in out
        assert f"history of credit-{n}" not in out
    assert "no such credit in the billing console" in out.split("history of demo-run:credit-3")[0]
    assert "customer cancelled the order" in out.split("summary")[0]
    assert out.count("completed/reconcile") == 2  # the record line and the summary, once each
    assert "outcomes: {" not in out
    assert "billing received 3 credit requests" in out and "1 voided by the compensation" in out


def test_the_demo_piped_off_a_terminal_splits_no_key_or_event_name() -> None:
    """`toolledger demo | less` folded its tables into 80 columns: "demo-run:credi" over
    "t-2", "call_indetermi" over "nate"."""
    out = _demo(columns=None).stdout
    for n in "1234":
        assert f"│ demo-run:credit-{n} reserved" in out
    for event in ("call_indeterminate", "compensation_requested", "call_compensated"):
        assert f"│ {event} " in out
    assert re.search(r"demo-run:[^\s│]*[^\d\s│]\s*│", out) is None, out


def test_penny_pays_twice_without_the_ledger_and_once_with_it() -> None:
    shown = _demo("penny")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "penny: without ledger 2 payouts, with ledger 1 payout" in shown.stdout
    assert "after restart: po_3 (the ledger's recorded result)" in shown.stdout
