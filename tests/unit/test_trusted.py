"""Records the decider and the fold build without validation are the records validation makes.

`toolledger.events.trusted` builds verdicts, call and run records and history entries from
values already validated, skipping pydantic. If a construction site left a field out, put one
in the wrong order (pydantic serialises in `__dict__` order, so the JSON of a verdict or a fact
would change) or passed a value of another type, the ledger would still fold, but differently
from a validated one. These tests hold every such record to its validated twin; the lifecycle
state machine does the same after every random event (`assert_as_validated`).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from scripts.record_log_fixture import fold
from toolledger.events.fold import HistoryEntry, LedgerFold
from toolledger.events.records import RunRecord
from toolledger.events.trusted import build, replace

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "recorded_log_v1.jsonl"


def assert_as_validated(model: BaseModel) -> None:
    """`model` equals, and dumps to the same JSON as, the same values validated by pydantic."""
    again = type(model).model_validate(model.model_dump())
    assert again == model
    assert again.model_dump_json() == model.model_dump_json()
    assert list(again.__dict__) == list(model.__dict__), "fields out of declaration order"


def assert_ledger_as_validated(ledger: LedgerFold) -> None:
    for record in (*ledger.calls.values(), *ledger.runs.values()):
        assert_as_validated(record)
    for entry in ledger.history:
        assert_as_validated(entry)
    for verdict in ledger.verdicts.values():
        assert_as_validated(verdict)


def test_the_recorded_log_folds_to_records_equal_to_validated_ones() -> None:
    """A construction site with a field missing, misplaced or mistyped fails here."""
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    ledger = fold(records)
    assert ledger.history and ledger.calls and ledger.runs
    assert_ledger_as_validated(ledger)


def test_replace_changes_only_what_it_names_and_keeps_the_original() -> None:
    run = RunRecord(run_id="r1", tenant_id="t")
    paused = replace(run, {"status": "paused", "waiting_on": "r1:c1"})
    assert paused == run.model_copy(update={"status": "paused", "waiting_on": "r1:c1"})
    assert run.status == "running" and run.waiting_on is None
    assert_as_validated(paused)


def test_a_built_model_is_frozen_like_a_validated_one() -> None:
    validated = HistoryEntry(
        key="r1:c1",
        event_id=uuid.UUID("6fd9e6bd-6e7a-4b8c-951e-4f67b7f1ec82"),
        event_type="call_reserved",
        partition=0,
        offset=1,
        accepted=True,
        reason="accepted",
        detail="r1:c1 reserved",
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        actor="runtime:host/1",
        version=1,
        event_json="{}",
        chain_hash="00",
    )
    entry = build(HistoryEntry, dict(validated.__dict__))
    assert entry == validated
    assert_as_validated(entry)
    with pytest.raises(ValidationError, match="frozen"):
        entry.key = "other"  # type: ignore[misc]
