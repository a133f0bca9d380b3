"""The ledger as a pure fold over the log: the in-memory projection and the replay reference.

`LedgerFold` applies events in log order through `decide()`, skips event_ids it has already
decided (resends reuse the event_id), and keeps the same three things every store keeps: the
current records, the append-only history with verdicts, and the runs. `MemoryLedger` is a thin
shell around it, and tests fold a recorded log with it to compare against PostgreSQL.

Every history entry carries `chain_hash`, which links it to the entry before it of the same key
(`chain_hash()` says exactly over which bytes), so an auditor holding only the history table
can tell whether an entry of a key was removed, altered or reordered (`broken_chains()`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict

from toolledger.events.lifecycle import decide, new_run
from toolledger.events.models import Event, OperatorEvent, ReconcileAttempted, canonical_json
from toolledger.events.records import CallRecord, Reason, RunRecord, Verdict
from toolledger.events.signing import VerifyKeys
from toolledger.events.trusted import build, replace


class HistoryEntry(BaseModel):
    """One request as the ledger saw it, accepted or rejected, in log order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    event_id: uuid.UUID
    event_type: str
    partition: int
    offset: int
    accepted: bool
    reason: Reason
    detail: str
    occurred_at: datetime
    actor: str
    version: int | None
    event_json: str
    chain_hash: str


def chain_hash(previous: str | None, event_json: str, accepted: bool, reason: str) -> str:
    """The hash that links a history entry to the previous entry of its key, as hex.

    SHA-256 over: the previous entry's chain hash as 32 raw bytes (nothing for a key's first
    entry), the event as stored in the history (`event_json`, UTF-8), a newline, then
    `accepted <reason>` or `rejected <reason>` (UTF-8). The verdict is covered so that flipping a
    rejected request into an accepted one breaks the chain too. Log positions are not covered:
    a faithful copy of the log into another topic keeps its chains. Migration 0004 computes
    the same bytes in SQL for history written before chains existed.
    """
    h = hashlib.sha256(bytes.fromhex(previous) if previous else b"")
    h.update(event_json.encode())
    h.update(f"\n{'accepted' if accepted else 'rejected'} {reason}".encode())
    return h.hexdigest()


def broken_chains(history: Iterable[HistoryEntry], limit: int = 20) -> list[str]:
    """Where the chains of `history` break, one sentence per break (empty: every chain holds).

    Entries are walked per key in log order and each `chain_hash` is recomputed from the
    entry's own bytes and the stored hash of the entry before it. An altered entry breaks at
    itself; a removed or reordered one breaks the entry after it. A removed last entry leaves
    no trace in the chain: comparing with a re-fold of the log (`replay --verify`) finds it.
    """
    previous: dict[str, str] = {}
    out: list[str] = []
    for entry in sorted(history, key=lambda e: (e.partition, e.offset)):
        expected = chain_hash(
            previous.get(entry.key), entry.event_json, entry.accepted, entry.reason
        )
        if entry.chain_hash != expected:
            out.append(
                f"history chain of key {entry.key} breaks at partition {entry.partition} "
                f"offset {entry.offset} ({entry.event_type}): this entry was altered, or an "
                "entry of this key before it was removed or moved"
            )
        previous[entry.key] = entry.chain_hash
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


@dataclass(frozen=True)
class Positioned:
    """An event with the log position it was read from."""

    partition: int
    offset: int
    event: Event


@dataclass(frozen=True)
class DeadLetter:
    """A log record that could not be decoded. Its run (from the record key) is quarantined."""

    partition: int
    offset: int
    run_id: str | None
    reason: str
    payload: bytes


class Folded(NamedTuple):
    """One record as a fold decided it, and the rows it left: what a store writes for it
    without deciding it again (`LedgerFold.folded`; a leader's fold handed to its projector).

    `verdict` is None for a dead letter and for an event_id decided before (a resend, which
    writes nothing); `call` and `run` are the records the fold holds after this record, where
    it changed them (None: unchanged); `verdict_json` is the verdict's `model_dump_json()` if
    whoever folded it made it already (a leader, to answer with it), so it is made once. The
    history entry is not here: it chains to its key's previous entry, which the store that
    writes it knows (`toolledger.projections.store`).
    """

    item: Positioned | DeadLetter
    verdict: Verdict | None
    call: CallRecord | None
    run: RunRecord | None
    verdict_json: str | None = None


def actor_of(event: Event) -> str:
    """Who appended an event, as auditors read it: an operator's id, else the process."""
    if isinstance(event, OperatorEvent):
        return f"operator:{event.operator}"
    # `__dict__`, not getattr: a pydantic model raises (slowly) for a field it does not have.
    source = (
        "reconcile"
        if isinstance(event, ReconcileAttempted)
        else event.__dict__.get("source", "runtime")
    )
    producer = event.producer
    return f"{source}:{producer.host}/{producer.pid}"


def history_entry(item: Positioned, verdict: Verdict, previous: str | None) -> HistoryEntry:
    """The history entry of a decided event; `previous` is its key's chain head. Built from
    the validated event and verdict without validating again (`toolledger.events.trusted`)."""
    event = item.event
    version = verdict.call.version if verdict.call is not None and event.tool_call_id else None
    if event.tool_call_id is None and verdict.run is not None:
        version = verdict.run.version
    event_json = event.history_json()
    return build(
        HistoryEntry,
        {
            "key": event.key,
            "event_id": event.event_id,
            "event_type": event.type,
            "partition": item.partition,
            "offset": item.offset,
            "accepted": verdict.accepted,
            "reason": verdict.reason,
            "detail": verdict.detail,
            "occurred_at": event.occurred_at,
            "actor": actor_of(event),
            "version": version,
            "event_json": event_json,
            "chain_hash": chain_hash(previous, event_json, verdict.accepted, verdict.reason),
        },
    )


def quarantined(run: RunRecord | None, run_id: str, reason: str) -> RunRecord:
    """The run record after a dead letter named it: quarantined, tenant kept if known."""
    if run is None:
        run = new_run(run_id, None, None)
    return replace(run, {"quarantined": True, "quarantine_reason": reason})


@dataclass
class LedgerFold:
    """Current records, runs and history, folded in log order.

    `heads` maps each history key to the chain hash of its latest entry. `with_history=False`
    folds records, runs and verdicts alone (a leader answers verdicts; its projection writes the
    history): an entry's chain hash and canonical JSON cost more than deciding the event.
    """

    keys: VerifyKeys = field(default_factory=VerifyKeys)
    calls: dict[str, CallRecord] = field(default_factory=dict)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    history: list[HistoryEntry] = field(default_factory=list)
    verdicts: dict[uuid.UUID, Verdict] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    heads: dict[str, str] = field(default_factory=dict)
    with_history: bool = True

    def apply(self, item: Positioned | DeadLetter) -> Verdict | None:
        """Fold one log record. Returns None for an event_id already decided or a dead letter."""
        if isinstance(item, DeadLetter):
            self.dead_letters.append(item)
            if item.run_id is not None:
                run = self.runs.get(item.run_id)
                self.runs[item.run_id] = quarantined(run, item.run_id, item.reason)
            return None
        event = item.event
        if event.event_id in self.verdicts:
            return None
        call = self.calls.get(event.key) if event.tool_call_id is not None else None
        verdict = decide(self.runs.get(event.run_id), call, event, keys=self.keys)
        self.verdicts[event.event_id] = verdict
        if verdict.accepted:
            if verdict.call is not None:
                self.calls[verdict.call.key] = verdict.call
            if verdict.run is not None:
                self.runs[verdict.run.run_id] = verdict.run
        elif verdict.call is not None and verdict.call is not call:
            self.calls[verdict.call.key] = verdict.call  # rejected, but flagged contested
        if not self.with_history:
            return verdict
        entry = history_entry(item, verdict, self.heads.get(event.key))
        self.heads[event.key] = entry.chain_hash
        self.history.append(entry)
        return verdict

    def folded(self, item: Positioned | DeadLetter) -> Folded:
        """`apply`, saying what it decided and which records it changed (`Folded`)."""
        if isinstance(item, DeadLetter):
            self.apply(item)
            run_id = item.run_id
            return Folded(item, None, None, None if run_id is None else self.runs[run_id])
        event = item.event
        calls, runs = self.calls, self.runs
        key = event.key if event.tool_call_id is not None else None
        call = None if key is None else calls.get(key)
        run = runs.get(event.run_id)
        verdict = self.apply(item)
        if verdict is None:
            return Folded(item, None, None, None)
        after = None if key is None else calls.get(key)
        run_after = runs.get(event.run_id)
        return Folded(
            item,
            verdict,
            None if after is call else after,
            None if run_after is run else run_after,
        )

    def digest(self) -> str:
        """A digest of records, runs and history: equal ledgers have equal digests."""
        return ledger_digest(
            self.calls.values(), self.runs.values(), self.history, len(self.dead_letters)
        )


def ledger_digest(
    calls: Iterable[CallRecord],
    runs: Iterable[RunRecord],
    history: Iterable[HistoryEntry],
    dead_letters: int,
) -> str:
    """SHA-256 over the canonical JSON of the ledger, in a store-independent order: every call
    in key order, then every run in run_id order, then the history in log order. A replay split
    across processes hashes the same lines (`call_line`, `run_line`, `history_line`), made in
    several places, in the same order."""
    h = hashlib.sha256()
    for call in sorted(calls, key=lambda c: c.key):
        h.update(call_line(call))
    h.update(RUNS_MARK)
    for run in sorted(runs, key=lambda r: r.run_id):
        h.update(run_line(run))
    h.update(HISTORY_MARK)
    for entry in sorted(history, key=lambda e: (e.partition, e.offset)):
        h.update(history_line(entry))
    h.update(dead_letters_mark(dead_letters))
    return h.hexdigest()


#: What `ledger_digest` hashes between the calls and the runs, and between the runs and history.
RUNS_MARK = b"|runs|"
HISTORY_MARK = b"|history|"


def dead_letters_mark(dead_letters: int) -> bytes:
    """What `ledger_digest` hashes last."""
    return f"|dead_letters|{dead_letters}".encode()


def call_line(call: CallRecord) -> bytes:
    """A call as `ledger_digest` hashes it."""
    return digest_json(call.ledger_form())


def run_line(run: RunRecord) -> bytes:
    """A run as `ledger_digest` hashes it."""
    return digest_json(run.ledger_form())


def history_line(entry: HistoryEntry) -> bytes:
    """A history entry as `ledger_digest` hashes it."""
    return digest_json(entry.model_dump(mode="json"))


def digest_json(value: Any) -> bytes:
    """`canonical_json(value)` as UTF-8, made by orjson where it can (7x faster: 1 us against
    7 for a call record). For what the digest's lines hold (JSON-mode dumps of records without
    a float field: text, integers, booleans, None, lists, objects with text keys) both write the
    same bytes, key order included (`tests/unit/test_digest_lines.py` holds them to it, every
    code point and the models' field types alike). Whatever orjson refuses (an integer beyond
    64 bits, a lone surrogate) takes the standard library's way, as every line did before."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return canonical_json(value).encode()
