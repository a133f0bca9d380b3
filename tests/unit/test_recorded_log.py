"""A recorded log folds to the recorded ledger: rule changes may not rewrite old history.

The fixture (`tests/fixtures/recorded_log_v1.jsonl`, Avro bytes as released) was written once by
`scripts/record_log_fixture.py`. If this test fails, a change to the decider or the codec folds
an existing log differently: version the rule (SCHEMA_VERSION) instead of changing it in place.
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.record_log_fixture import expected, fold

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _load(version: int) -> tuple[list[dict[str, object]], dict[str, object]]:
    lines = (FIXTURES / f"recorded_log_v{version}.jsonl").read_text().splitlines()
    want = json.loads((FIXTURES / f"recorded_ledger_v{version}.json").read_text())
    return [json.loads(line) for line in lines], want


def test_the_v1_log_folds_to_the_v1_ledger_record_by_record() -> None:
    records, want = _load(1)
    got = expected(fold(records))
    assert got["history"] == want["history"]
    assert got["calls"] == want["calls"]
    assert got["runs"] == want["runs"]
    assert got["digest"] == want["digest"]


def test_the_fixture_exercises_every_verdict_it_claims_to() -> None:
    """Guards the fixture itself: it must keep covering rejections, not only happy paths."""
    _, want = _load(1)
    history = want["history"]
    assert isinstance(history, list)
    reasons = {row[4] for row in history}
    assert {
        "accepted",
        "held",
        "already_completed",
        "key_conflict",
        "late_outcome",
        "before_deadline",
        "unsigned",
        "abandoned_reservation",
        "tenant_mismatch",
        "nothing_to_undo",
        "stale_driver",
        "missing_run_version",
        "quarantined",
    } <= reasons
