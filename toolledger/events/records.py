"""The state the decider folds events into: one record per call key, one per run, and verdicts.

These are plain frozen values. Stores persist them (PostgreSQL columns, memory dicts) and hand
them back to `decide()`; nothing here does I/O.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

CallStatus = Literal[
    "started",
    "awaiting_approval",
    "approved",
    "completed",
    "failed",
    "indeterminate",
    "compensating",
    "compensated",
]
SETTLED: frozenset[CallStatus] = frozenset({"completed", "failed", "compensated"})
UNSETTLED: frozenset[CallStatus] = frozenset({"started", "indeterminate"})

RunStatus = Literal[
    "running",
    "awaiting_reconciliation",
    "awaiting_approval",
    "duplicate_intent",
    "paused",
    "completed",
    "failed",
    "cancelled",
]

SettledBy = Literal["runtime", "reconcile", "operator"]

#: Why the decider accepted or rejected an event. A closed set so the API, the CLI and analytics
#: can branch on it; `Verdict.detail` carries the sentence for people.
Reason = Literal[
    "accepted",
    "held",
    "already_completed",
    "key_conflict",
    "abandoned_reservation",
    "late_outcome",
    "not_current_reservation",
    "unknown_call",
    "status_mismatch",
    "version_mismatch",
    "before_deadline",
    "nothing_to_undo",
    "stale_driver",
    "missing_run_version",
    "unknown_run",
    "run_exists",
    "run_finished",
    "tenant_mismatch",
    "quarantined",
    "unsigned",
    "bad_signature",
    "contested",
]


class CallRecord(BaseModel):
    """The ledger's current truth about one call key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    run_id: str
    tool_call_id: str
    tenant_id: str
    tool: str
    effect: str
    status: CallStatus
    version: int
    reservation_id: uuid.UUID
    args_digest: str
    arguments_json: str
    requires_approval: bool
    deadline: datetime
    not_attempted: bool = False
    result_json: str | None = None
    result_reference: str | None = None
    error: str | None = None
    settled_by: SettledBy | None = None
    operator: str | None = None
    reason: str | None = None
    reconcile_attempts: int = 0
    #: A settled call whose late outcome for the settled reservation contradicts how it was
    #: settled (schema v2): `failed` by an operator or reconcile, then a `completed` arrived (or
    #: the reverse). Not a status: the call keeps its status, but a contested `failed` call is
    #: not rerunnable until an operator decides again. `contested_evidence` says what arrived.
    contested: bool = False
    contested_evidence: str | None = None
    #: Arguments / result stored by reference (SHA-256 of the text, `toolledger.events.payloads`);
    #: the text field is then "" until a reader restores it from the blob.
    arguments_blob: str | None = None
    result_blob: str | None = None
    created_at: datetime
    updated_at: datetime

    @property
    def idempotency_key(self) -> str:
        return self.key

    def ledger_form(self) -> dict[str, Any]:
        """The record as digests and the recorded-log fixture cover it: its JSON dump without
        the fields added after schema v1 while they hold their defaults, so a log that never
        used them folds to the same digest as before they existed."""
        return _without_new_defaults(self, _CALL_FIELDS_SINCE_V1)


#: CallRecord fields added after schema v1; `ledger_form` leaves them out at their defaults.
_CALL_FIELDS_SINCE_V1 = ("contested", "contested_evidence", "arguments_blob", "result_blob")
_RUN_FIELDS_SINCE_V1 = ("state_blob", "resume_error")


def _without_new_defaults(record: BaseModel, added: tuple[str, ...]) -> dict[str, Any]:
    dumped = record.model_dump(mode="json")
    fields = type(record).model_fields
    for name in added:
        if dumped[name] == fields[name].default:
            del dumped[name]
    return dumped


class RunRecord(BaseModel):
    """A run: its tenant (bound by its first accepted event) and its fencing version.

    `version is None` means the run has no checkpoints: calls are reserved without run fencing
    (toolledger used as a bare ledger). `tenant_id is None` only for a run that was quarantined
    before any event of it could be read.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    tenant_id: str | None
    version: int | None = None
    status: RunStatus = "running"
    agent: str = ""
    checkpoint_calls: tuple[str, ...] = ()
    state_json: str = "{}"
    #: The transcript stored by reference (as `CallRecord.result_blob`); `state_json` is then "".
    state_blob: str | None = None
    waiting_on: str | None = None
    abandoned: tuple[str, ...] = ()
    quarantined: bool = False
    quarantine_reason: str | None = None
    updated_at: datetime | None = None
    #: Set by an accepted `run_resume_failed`: the resume hook kept failing for this pause
    #: (how often, and its last error). Cleared by the run's next accepted run event.
    resume_error: str | None = None

    def ledger_form(self) -> dict[str, Any]:
        """As `CallRecord.ledger_form`: the fields added after v1 left out at their defaults."""
        return _without_new_defaults(self, _RUN_FIELDS_SINCE_V1)


class Verdict(BaseModel):
    """What the decider said about one event, and the state it left behind.

    `call`/`run` are the records *after* the event (`None` if none exists), so a waiter learns
    the ledger's truth from the verdict alone. A rejected event leaves them unchanged, with one
    exception: a late outcome that contradicts a settlement is rejected *and* flags the call
    `contested` (one version later).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: uuid.UUID
    event_type: str
    key: str
    run_id: str
    accepted: bool
    reason: Reason
    detail: str
    call: CallRecord | None = None
    run: RunRecord | None = None
