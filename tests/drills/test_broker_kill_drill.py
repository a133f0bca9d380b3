"""A drill whose Apache Kafka broker is SIGKILLed mid-load and restarted on its data.

With acks=all a record the broker acknowledged is on its log before the acknowledgement leaves,
so a broker killed mid-load and started again on the same data folder must give back every
event a runtime saw acknowledged (a verdict it heard, or an outcome it returned on Kafka's
acknowledgement). Meanwhile runtimes whose appends failed must have told the truth: a call is
completed once, or ends `indeterminate` or not attempted as the decider's table says (the drill's
effect checks), with no duplicate effect, and the ledger must equal a re-fold of the log. The
broker is the drill's own (`toolledger.drill.services`), never the session's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolledger.devstack import Services
from toolledger.drill.run import DrillConfig, run_drill
from toolledger.drill.summary import plain_summary

SEED = int(os.environ.get("TOOLLEDGER_DRILL_SEED", "5"))


@pytest.mark.timeout(600)
async def test_a_drill_loses_no_acknowledged_event_when_its_broker_is_killed_twice(
    dev_services: Services, tmp_path: Path
) -> None:
    """Two broker SIGKILLs in the middle of the runs: no acknowledged event may be missing from
    the log afterwards, no call may take effect twice, every run must still finish, and the
    ledger must equal a re-fold of the log."""
    home = tmp_path / "drill"
    config = DrillConfig(
        runs=12,
        calls=3,
        kills=12,
        seed=SEED,
        home=home,
        broker_kills=2,
        reconciler_kill_every=0.0,
        zombie_every=0.0,
        projector_kill_every=15.0,
        timeout=420,
    )
    report = await run_drill(config, services=dev_services)
    summary = plain_summary(report)
    print(summary)
    assert report.ok, f"drill with seed {SEED} violated its checks (logs in {home}):\n{summary}"
    assert len(report.chaos.broker_recoveries) == 2, summary
    assert report.acknowledged_checked > 0, summary
    assert report.tally.duplicates == 0, summary
    assert "no acknowledged event lost" in {c.name for c in report.checks}
