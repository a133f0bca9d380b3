"""Write the recorded-log fixture: a log covering every rule, and the ledger it folds to.

Run deliberately (`python -m scripts.record_log_fixture`) only when a new schema version is
released; the committed files are what CI folds to prove old logs still fold the same. After a
deliberate change to how the ledger stores history (never to the log),
`python -m scripts.record_log_fixture --expected-only` refolds the committed log and rewrites
only the expected ledger.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

from tests import builders as b
from toolledger.events.codec import DecodeError, decode, encode
from toolledger.events.fold import DeadLetter, LedgerFold, Positioned
from toolledger.events.models import SCHEMA_VERSION, Event

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def scenario() -> list[tuple[str, bytes]]:
    """(record key, value) in log order: one partition, every rule of the decider exercised."""
    events: list[Event | tuple[str, bytes]] = []
    # A bare run: reserve, conflict, complete, replay refused, late outcome.
    r = b.reserved("bare", "c1", t=0)
    events += [r, b.reserved("bare", "c1", t=1), b.completed(r, t=2), b.reserved("bare", "c1", t=3)]
    events += [b.reserved("bare", "c1", arguments={"amount_cents": 1}, t=4)]
    # Indeterminate, reconcile attempt, found.
    r2 = b.reserved("bare", "c2", t=10)
    events += [r2, b.indeterminate(r2, t=11), b.attempted(r2, 2, t=12), b.found(r2, 3, t=13)]
    events += [b.completed(r2, t=14)]  # late: kept as evidence
    # Operator resolution: before the deadline refused, unsigned refused, then settled.
    r3 = b.reserved("bare", "c3", t=20, timeout=10)
    events += [r3, b.resolved(r3, 1, t=25), b.resolved(r3, 1, t=60, signed=False)]
    events += [b.resolved(r3, 1, t=60, outcome="failed"), b.completed(r3, t=61)]
    # Not attempted, run again; abandoned tombstone; tenant mismatch.
    r4 = b.reserved("bare", "c4", t=30)
    r4b = b.reserved("bare", "c4", t=32)
    events += [r4, b.failed(r4, t=31, not_attempted=True), r4b, b.completed(r4b, t=33)]
    r5 = b.reserved("bare", "c5", t=40)
    events += [b.abandoned(r5, t=41), r5, b.reserved("bare", "c6", tenant="evil", t=42)]
    # Approval gate and compensation.
    r6 = b.reserved("bare", "c7", requires_approval=True, t=50)
    r6b = b.reserved("bare", "c7", requires_approval=True, t=52)
    events += [r6, b.approved(r6, 1, t=51), r6b, b.completed(r6b, t=53)]
    events += [b.compensation_requested(r6b, 4, t=54)]
    r7 = b.reserved("bare", "c8", requires_approval=True, t=55)
    events += [r7, b.rejected(r7, 1, t=56), b.compensation_requested(r7, 2, t=57)]
    # A fenced run: two drivers, one stands down.
    events += [b.run_started("fenced", t=60), b.checkpointed("fenced", 0, ("a1",), t=61)]
    events += [b.checkpointed("fenced", 0, ("b1",), t=62)]
    events += [b.reserved("fenced", "b1", run_version=0, t=63)]
    events += [b.reserved("fenced", "a1", run_version=1, t=64)]
    events += [b.reserved("fenced", "a1", t=65)]
    # A dead letter quarantines its run; the run's next event is refused.
    events += [("poisoned", b"\xc3\x01garbage")]
    events += [b.reserved("poisoned", "c1", t=70)]
    out: list[tuple[str, bytes]] = []
    for item in events:
        out.append(item if isinstance(item, tuple) else (item.run_id, encode(item)))
    return out


def fold(records: list[dict[str, object]]) -> LedgerFold:
    """Fold recorded records the way the projector does (decode, or dead-letter)."""
    ledger = LedgerFold(keys=b.KEYS)
    for rec in records:
        offset = int(str(rec["offset"]))
        value = base64.b64decode(str(rec["value"]))
        try:
            ledger.apply(Positioned(0, offset, decode(value)))
        except DecodeError as err:
            ledger.apply(DeadLetter(0, offset, str(rec["key"]), str(err), value))
    return ledger


def expected(ledger: LedgerFold) -> dict[str, object]:
    return {
        "schema_version": SCHEMA_VERSION,
        "digest": ledger.digest(),
        "calls": {k: c.ledger_form() for k, c in sorted(ledger.calls.items())},
        "runs": {k: r.ledger_form() for k, r in sorted(ledger.runs.items())},
        "history": [
            [h.offset, h.key, h.event_type, h.accepted, h.reason, h.version] for h in ledger.history
        ],
    }


def main() -> None:
    log_path = OUT / f"recorded_log_v{SCHEMA_VERSION}.jsonl"
    if "--expected-only" in sys.argv:
        records = [json.loads(line) for line in log_path.read_text().splitlines()]
    else:
        records = [
            {"offset": n + 1, "key": key, "value": base64.b64encode(value).decode()}
            for n, (key, value) in enumerate(scenario())
        ]
        OUT.mkdir(parents=True, exist_ok=True)
        log_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ledger_path = OUT / f"recorded_ledger_v{SCHEMA_VERSION}.json"
    ledger_path.write_text(json.dumps(expected(fold(records)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {log_path} ({len(records)} records) and {ledger_path}")


if __name__ == "__main__":
    main()
