"""Evidence for the drill's checks, built by hand: a healthy drill, and its parts to break.

`healthy()` is the evidence of one finished run that kept every guarantee; a test breaks one
thing in it and asks `failed()` which checks caught it (tests/drills/test_drill_parts.py and the
tests of the newer checks beside it).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from toolledger.drill.billing import Effect
from toolledger.drill.checks import Check, Evidence, Refold, judge
from toolledger.drill.model import TENANT
from toolledger.drill.operator import ListingChecks
from toolledger.events.fold import HistoryEntry
from toolledger.events.records import CallRecord, RunRecord
from toolledger.projections.store import LedgerSnapshot

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def call(
    key: str, status: str, credit: str | None = None, settled_by: str = "runtime"
) -> CallRecord:
    run_id, _, call_id = key.partition(":")
    return CallRecord(
        key=key,
        run_id=run_id,
        tool_call_id=call_id,
        tenant_id=TENANT,
        tool="drill.charge",
        effect="external",
        status=status,
        version=2,
        reservation_id=uuid.uuid4(),
        args_digest="d",
        arguments_json="{}",
        requires_approval=False,
        deadline=T0 + timedelta(seconds=1),
        result_json=None if credit is None else json.dumps({"credit_id": credit}),
        settled_by=settled_by,
        created_at=T0,
        updated_at=T0,
    )


def entry(key: str, offset: int, event_type: str, event: dict[str, object]) -> HistoryEntry:
    return HistoryEntry(
        key=key,
        event_id=uuid.uuid4(),
        event_type=event_type,
        partition=0,
        offset=offset,
        accepted=True,
        reason="accepted",
        detail="",
        occurred_at=T0,
        actor="runtime:h/1",
        version=1,
        event_json=json.dumps(event),
        chain_hash="",
    )


def healthy() -> Evidence:
    """One finished run of two steps: step 0 failed once (no effect) and was retried."""
    calls = {
        "r1:s0": call("r1:s0", "failed", settled_by="reconcile"),
        "r1:s0r1": call("r1:s0r1", "completed", "cr_a"),
        "r1:s1": call("r1:s1", "completed", "cr_b"),
    }
    history = [entry(key, n, "call_reserved", {}) for n, key in enumerate(calls, start=1)] + [
        entry("r1", 9, "run_finished", {"detail": "charged acct-r1 2 times: cr_a, cr_b"})
    ]
    snapshot = LedgerSnapshot(
        calls=calls,
        runs={"r1": RunRecord(run_id="r1", tenant_id=TENANT, version=5, status="completed")},
        history=history,
        dead_letters=0,
    )
    return Evidence(
        snapshot=snapshot,
        effects=[Effect("r1:s0r1", "cr_a", "r1/s0"), Effect("r1:s1", "cr_b", "r1/s1")],
        requests={"r1:s0r1": Counter(credited=1), "r1:s1": Counter(credited=1)},
        runs=["r1"],
        calls=2,
        tenant=TENANT,
        reconciler_pids=set(),
        listing=ListingChecks(passes=3, judged=4),
        unsettled_at_end=set(),
        listed_at_end=set(),
        refold=Refold("abc", "abc", 4, []),
        poison=[],
        kills=Counter(model=1),
        kills_requested=1,
        unattributed_kills=0,
        errors=[],
    )


def failed(evidence: Evidence) -> set[str]:
    checks: list[Check] = judge(evidence)[0]
    return {c.name for c in checks if not c.ok}
