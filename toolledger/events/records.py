"""The state the decider folds events into: one record per call key, one per run, and verdicts.

These are plain frozen values. Stores persist them (PostgreSQL columns, memory dicts) and hand
them back to `decide()`; nothing here does I/O.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

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
    created_at: datetime
    updated_at: datetime

    @property
    def idempotency_key(self) -> str:
        return self.key


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
    waiting_on: str | None = None
    abandoned: tuple[str, ...] = ()
    quarantined: bool = False
    quarantine_reason: str | None = None
    updated_at: datetime | None = None


class Verdict(BaseModel):
    """What the decider said about one event, and the state it left behind.

    `call`/`run` are the records *after* the event (unchanged when rejected, `None` if none
    exists), so a waiter learns the ledger's truth from the verdict alone.
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
