"""The long drill, `toolledger drill --runs 1000 --kills 2000`: behind `pytest --drills`.

It is the CI drill twenty times over, with the settings docs/DRILLS.md gives for the local
broker (16 partitions, a 20 ms projector fetch wait, a 10 s identity watch: tansu's cost per
fetch grows with a partition's history; finding 6). `TOOLLEDGER_DRILL_SEED` picks the seed.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from toolledger.devstack import Services
from toolledger.drill.run import DrillConfig, run_drill
from toolledger.drill.summary import plain_summary

SEED = int(os.environ.get("TOOLLEDGER_DRILL_SEED", "1"))
#: The drill's own timeout is its default, which follows the work (`default_timeout`); the
#: test's is longer, so that a slow drill ends with its time-out report, not pytest's.
CONFIG = DrillConfig(runs=1000, calls=5, kills=2000, seed=SEED, partitions=16)


@pytest.mark.drill
@pytest.mark.timeout(CONFIG.time_limit + 1800)
async def test_the_long_drill_keeps_every_guarantee_through_two_thousand_kills(
    dev_services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rare interleavings need many kills to show up: 2000 of them, over 1000 runs."""
    # The drill's processes inherit these settings from the environment.
    monkeypatch.setenv("TOOLLEDGER_FETCH_WAIT_MS", "20")
    monkeypatch.setenv("TOOLLEDGER_IDENTITY_CHECK_S", "10")
    home = tmp_path / "drill"
    config = replace(CONFIG, home=home)
    report = await run_drill(config, services=dev_services)
    summary = plain_summary(report)
    print(summary)
    assert report.ok, f"drill with seed {SEED} violated its checks (logs in {home}):\n{summary}"
