"""The demo a new user runs first must show each scenario ending the way the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from toolledger.cli.dev import dev_signing_key
from toolledger.devstack import STATE_DIR, Services, remove_namespace
from toolledger.events.signing import SigningKey, parse_signing_keys
from toolledger.examples.billing_reconciliation.demo import EXPECTED, LIVE_CREDITS, problems

ROOT = Path(__file__).resolve().parents[2]


def _demo(
    *args: str,
    columns: str | None = "160",
    cwd: Path = ROOT,
    services: Services | None = None,
    leader: str | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env.pop("COLUMNS", None)
    if services is not None:
        env |= {
            "TOOLLEDGER_DATABASE_URL": services.database_url,
            "TOOLLEDGER_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
        }
    if leader is not None:
        env["TOOLLEDGER_LEADER"] = leader
    return subprocess.run(
        [sys.executable, "-m", "toolledger", "demo", *args],
        cwd=cwd,
        env=env if columns is None else {**env, "COLUMNS": columns},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _ends_as_documented(shown: subprocess.CompletedProcess[str]) -> None:
    """1: found by the reconcile hook; 2: failed by an operator over HTTP; 3: compensated on an
    operator's request; 4: refused before sending, failed and not attempted."""
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert "scenario 1: completed/reconcile" in lines
    assert "scenario 2: failed/operator alice" in lines
    assert "scenario 3: compensated/asked for by operator alice" in lines
    assert "scenario 4: failed/runtime" in lines
    assert "POST .../demo-run:credit-2/resolve -> 200" in shown.stdout
    assert "POST .../demo-run:credit-3/compensate -> 200" in shown.stdout
    assert "live credits in billing: 1" in lines
    assert "not as documented" not in shown.stdout


def test_the_billing_demo_settles_each_scenario_as_documented() -> None:
    _ends_as_documented(_demo())


@pytest.mark.parametrize("leader", ["auto", "off"])
def test_the_stack_demo_settles_each_scenario_as_documented_on_both_paths(
    tmp_path: Path, dev_services: Services, leader: str
) -> None:
    """On the leader path the operator API, reading PostgreSQL a batch behind the leader's
    answers, got a 404 for the credit it was asked to undo: the demo printed `compensate ->
    404` and "scenario 3: completed/runtime", and exited 0 (5 runs of 5)."""
    _ends_as_documented(_demo("--stack", cwd=tmp_path, services=dev_services, leader=leader))


def test_a_scenario_that_ends_otherwise_fails_the_demo_saying_which() -> None:
    """The demo exited 0 whatever its scenarios came to; now a wrong ending is its failure."""
    wrong = problems({**EXPECTED, "3": "completed/runtime"}, live_credits=2)
    assert wrong == [
        "scenario 3 ended completed/runtime, not compensated/asked for by operator alice",
        "billing holds 2 live credits, not 1",
    ]
    assert problems(dict(EXPECTED), LIVE_CREDITS) == []


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


def _exports(out: str) -> dict[str, str]:
    """The `export NAME=value` lines of `out` (a trailing `# comment` and quotes dropped)."""
    found = {}
    for line in out.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = value.split("  #")[0].strip().strip('"')
    return found


def _toolledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    return subprocess.run(
        [sys.executable, "-m", "toolledger", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def _schema_exists(services: Services, schema: str) -> bool:
    conn = await asyncpg.connect(services.database_url)
    try:
        found = await conn.fetchval(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", schema
        )
    finally:
        await conn.close()
    return found is not None


async def test_the_stack_demo_prints_its_exports_signs_with_the_dev_key_and_replays_clean(
    tmp_path: Path, dev_services: Services
) -> None:
    """`demo --stack` signed with a fresh key nobody had, so `replay --verify` on its log
    stopped at the first operator event saying "the partition is halted", a replay halts
    nothing; and it left its schema and topics behind. With the checkout's dev key it must
    replay identical from its own exports; a replay without the key must say it stopped."""
    key, _ = dev_signing_key(tmp_path / STATE_DIR)
    shown = _demo("--stack", "--keep", cwd=tmp_path, services=dev_services)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    exports = _exports(shown.stdout)
    schema, prefix = exports["TOOLLEDGER_SCHEMA"], exports["TOOLLEDGER_TOPIC_PREFIX"]
    try:
        assert exports["TOOLLEDGER_VERIFY_KEYS"] == key.public_setting()
        assert "# the dev key" in shown.stdout and key.setting() not in shown.stdout
        assert f"kept schema {schema}" in shown.stdout
        exports["TOOLLEDGER_SIGNING_KEYS"] = key.setting()
        replayed = _toolledger(exports, "replay", "--verify")
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert "identical to the live ledger" in replayed.stdout
        stranger = SigningKey.generate("stranger").public_setting()
        blind = _toolledger({**exports, "TOOLLEDGER_VERIFY_KEYS": stranger}, "replay")
        assert blind.returncode == 4, blind.stdout + blind.stderr
        assert "The replay stopped there (a replay halts nothing)" in blind.stderr
        assert "halted until" not in blind.stderr
    finally:
        await remove_namespace(dev_services, (schema,), prefix)


async def test_the_stack_demo_without_a_dev_key_prints_its_own_and_removes_its_schema(
    tmp_path: Path, dev_services: Services
) -> None:
    """Without a dev key the demo's key must be printed (else nothing can read its log), and
    without --keep its schema and topics must be gone when it exits."""
    shown = _demo("--stack", cwd=tmp_path, services=dev_services)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    exports = _exports(shown.stdout)
    [key] = parse_signing_keys(exports["TOOLLEDGER_SIGNING_KEYS"])
    assert exports["TOOLLEDGER_VERIFY_KEYS"] == key.public_setting()
    assert "the demo's own key" in shown.stdout
    schema = exports["TOOLLEDGER_SCHEMA"]
    assert f"removed schema {schema}" in shown.stdout
    assert not await _schema_exists(dev_services, schema)
