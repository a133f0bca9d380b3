"""`toolledger status` against a running deployment: a projector process, its leader, the log.

There was no such command: `dev status` knows only a developer's own stack, and a halted
partition or a projector gone showed only in the owning process's log and `/readyz`. The status
must name each partition's owner, its lease, its leader, its lag, a halt with what to deploy,
and the paused runs, and say with its exit status whether anything needs someone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from tests import builders as b
from tests.integration.procs import Proc, Procs, run_toolledger_async, toolledger_env, until
from tests.isolated import Isolated, running_stack
from tests.unit.test_lifecycle_framework_runs import paused
from toolledger.errors import ExitStatus
from toolledger.events.signing import SigningKey, sign
from toolledger.settings import Settings

START_TIMEOUT = 30.0


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    return {**env, **toolledger_env(settings)}


async def _status(settings: Settings) -> tuple[int, dict[str, Any], str]:
    code, out, err = await run_toolledger_async(_env(settings), "status", "--json")
    return code, json.loads(out) if out.strip() else {}, err


async def _status_until(
    settings: Settings, holds: Callable[[list[dict[str, Any]]], bool], what: str
) -> tuple[int, dict[str, Any], str]:
    """`status --json` once its partitions show what `holds` checks (polled, 30 s at most)."""

    async def check() -> tuple[int, dict[str, Any], str] | None:
        found = await _status(settings)
        return found if holds(found[1].get("partitions", [])) else None

    return await until(check, timeout=30, what=what)


async def _projector(procs: Procs, settings: Settings, **env: str) -> Proc:
    proc = procs.projector("projector", {**toolledger_env(settings), **env})
    await proc.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT)
    return proc


async def test_status_names_each_partitions_owner_leader_and_lag_and_the_paused_runs(
    isolated: Isolated, procs: Procs
) -> None:
    settings = isolated.settings(Settings)
    projector = await _projector(procs, settings)
    async with running_stack(settings, run_projector=False) as stack:
        r = b.reserved("waiting", "c1")
        for event in (r, b.indeterminate(r), paused("waiting", r.key)):
            assert (await stack.commands.append_and_await(event, 10)).accepted

    def caught_up(rows: list[dict[str, Any]]) -> bool:
        return bool(rows) and all(p["lag"] == 0 for p in rows)

    code, shown, err = await _status_until(settings, caught_up, "no lag in the status")
    assert code == ExitStatus.OK, (shown, err)
    assert [p["partition"] for p in shown["partitions"]] == [0, 1]
    for partition in shown["partitions"]:
        assert partition["owner"].startswith(f"pid {projector.pid} "), partition
        assert partition["leader"] and partition["leader"].startswith("127.0.0.1:"), partition
        assert partition["halted"] is None and partition["problems"] == []
    assert sum(p["next_offset"] for p in shown["partitions"]) >= 3
    assert shown["paused_runs"] == {"awaiting_reconciliation": 1}
    assert shown["problems"] == []

    code, out, err = await run_toolledger_async(_env(settings), "status")
    assert code == ExitStatus.OK, out + err
    assert f"pid {projector.pid}" in out and "awaiting_reconciliation" in out


async def test_status_exits_1_naming_a_halted_partition_and_one_without_a_projector(
    isolated: Isolated, procs: Procs
) -> None:
    settings = isolated.settings(Settings)
    projector = await _projector(procs, settings)
    async with running_stack(settings, run_projector=False) as stack:
        unknown = SigningKey.from_seed("ops-unknown", b"a key no projector was given 32b")
        r = b.reserved("halting", "c1", timeout=10)
        for event in (r, b.indeterminate(r, t=1)):
            assert (await stack.commands.append_and_await(event, 10)).accepted
        at = await stack.commands.append(sign(b.resolved(r, 2, t=120, signed=False), unknown), 10)

    def halted(rows: list[dict[str, Any]]) -> bool:
        return any(p["halted"] for p in rows)

    code, shown, err = await _status_until(settings, halted, "the halt in the status")
    assert code == ExitStatus.NO, (shown, err)
    (row,) = [p for p in shown["partitions"] if p["halted"]]
    assert row["partition"] == at.partition and "ops-unknown" in row["halted"]
    assert any(f"partition {at.partition} is halted" in p for p in shown["problems"])

    projector.kill()
    code, out, err = await run_toolledger_async(_env(settings), "status")
    assert code == ExitStatus.NO, out + err
    assert "no owner" in out and "has no projector: start one" in out


async def test_status_shows_each_partitions_lease_and_exits_1_once_its_owner_stops_renewing(
    isolated: Isolated, procs: Procs
) -> None:
    """A frozen owner (SIGSTOP) keeps its lock until its lease runs out, and nothing is
    projected meanwhile: the status must say so from the lease, not only once the lock is gone
    (issue 45: a partition whose owner stopped renewing, and how long ago it last renewed)."""
    settings = isolated.settings(Settings)
    projector = await _projector(procs, settings, TOOLLEDGER_OWNER_LEASE_S="3")

    def renewed(rows: list[dict[str, Any]]) -> bool:
        return bool(rows) and all(p["lease"] and not p["lease"]["stale"] for p in rows)

    code, shown, err = await _status_until(settings, renewed, "renewed leases in the status")
    assert code == ExitStatus.OK, (shown, err)
    for row in shown["partitions"]:
        assert row["lease"]["lease_s"] == 3.0 and row["lease"]["age_s"] < 1.5, row
        assert row["lease"]["owner"] and str(projector.pid) in row["lease"]["owner"], row

    projector.freeze()
    try:

        def stale(rows: list[dict[str, Any]]) -> bool:
            return bool(rows) and all(p["lease"] and p["lease"]["stale"] for p in rows)

        code, shown, err = await _status_until(settings, stale, "stale leases in the status")
        assert code == ExitStatus.NO, (shown, err)
        for row in shown["partitions"]:
            assert row["lease"]["age_s"] > 1.5, row
            assert any(
                f"partition {row['partition']}" in p and "lease" in p for p in row["problems"]
            ), row
        code, out, err = await run_toolledger_async(_env(settings), "status")
        assert code == ExitStatus.NO and "STALE LEASE" in out, out + err
    finally:
        projector.resume()


async def test_status_without_the_ledger_says_what_is_missing(isolated: Isolated) -> None:
    """No topic yet: exit 4 naming the command that creates it, as every command does."""
    settings = isolated.settings(Settings)
    code, out, err = await run_toolledger_async(_env(settings), "status")
    assert code == ExitStatus.LOG_MISMATCH, out + err
    assert "`toolledger projector`" in err
