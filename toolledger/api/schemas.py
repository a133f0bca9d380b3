"""The operator API's request and response bodies: what `/openapi.json` documents.

Records are shown as people and programs want them, not as they are stored: `arguments`,
`result` and each history entry's `event` are parsed JSON rather than JSON-in-a-string, and a
`started` call says when it becomes `resolvable_after`. Every error, whatever its status, has
one shape, `{"error": {"code", "message", ...}}`, where `code` is stable for programs (a
decider reason such as `version_mismatch`, or `invalid_token`, `not_found`, ...) and `message`
says what was wrong and what to do.

Text an operator types is refused if it holds NUL characters: PostgreSQL text columns cannot
store them, and an event the projector cannot write would stall its partition.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolledger.api.service import resolvable_after
from toolledger.events.fold import HistoryEntry
from toolledger.events.records import CallRecord, CallStatus, Reason, SettledBy

#: Some non-whitespace, and no NUL anywhere (see the module docstring).
_REASON_PATTERN = r"^[^\x00]*[^\s\x00][^\x00]*$"
_TEXT_PATTERN = r"^[^\x00]*$"

OperatorReason = Annotated[
    str,
    Field(
        min_length=1,
        max_length=2000,
        pattern=_REASON_PATTERN,
        description="Why: what the operator checked. Required; blank is refused.",
        examples=["credit cr_81 found in the billing console"],
    ),
]
Version = Annotated[int, Field(ge=0, le=2**63 - 1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResolveRequest(_Body):
    """Settle an unknown call: what the operator found in the other system."""

    outcome: Literal["completed", "failed"] = Field(
        description="completed: the effect happened; failed: it definitely did not."
    )
    reason: OperatorReason
    value: Any = Field(
        default=None, description="The call's result, when completed (stored as its result)."
    )
    result_reference: Annotated[str, Field(max_length=500, pattern=_TEXT_PATTERN)] | None = Field(
        default=None, description="The effect's id in the other system, when completed."
    )
    expected_version: Version | None = Field(
        default=None,
        description="The record version the operator looked at; the decision is refused (409) "
        "if the call moved since. Default: the current version.",
    )


class DecisionRequest(_Body):
    """Approve or reject a call that awaits approval."""

    reason: OperatorReason
    expected_version: Version | None = Field(
        default=None, description="The record version the operator looked at (default: current)."
    )


class CompensateRequest(_Body):
    """Ask for a completed call's effect to be undone by its tool's compensation."""

    reason: OperatorReason


class ToolExecution(BaseModel):
    """The ledger's current record of one call key."""

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
    arguments: Any = Field(description="The call's arguments (parsed JSON).")
    requires_approval: bool
    deadline: datetime
    resolvable_after: datetime | None = Field(
        description="For a started call: when an operator may resolve it (deadline + grace)."
    )
    not_attempted: bool
    result: Any = Field(default=None, description="The recorded result (parsed JSON), if any.")
    result_reference: str | None
    error: str | None
    settled_by: SettledBy | None
    operator: str | None
    reason: str | None
    reconcile_attempts: int
    contested: bool = Field(
        description="Settled, then a late outcome contradicted the settlement: a contested "
        "failed call does not run again until an operator resolves it again."
    )
    contested_evidence: str | None = Field(description="What contradicted the settlement.")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, record: CallRecord) -> ToolExecution:
        return cls(
            key=record.key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant_id=record.tenant_id,
            tool=record.tool,
            effect=record.effect,
            status=record.status,
            version=record.version,
            reservation_id=record.reservation_id,
            args_digest=record.args_digest,
            arguments=_parsed(record.arguments_json),
            requires_approval=record.requires_approval,
            deadline=record.deadline,
            resolvable_after=resolvable_after(record),
            not_attempted=record.not_attempted,
            result=None if record.result_json is None else _parsed(record.result_json),
            result_reference=record.result_reference,
            error=record.error,
            settled_by=record.settled_by,
            operator=record.operator,
            reason=record.reason,
            reconcile_attempts=record.reconcile_attempts,
            contested=record.contested,
            contested_evidence=record.contested_evidence,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


class HistoryItem(BaseModel):
    """One request for the key as the ledger saw it, accepted or rejected, in log order."""

    event_id: uuid.UUID
    event_type: str
    partition: int
    offset: int
    accepted: bool
    reason: Reason = Field(description="accepted, or why the ledger rejected the request.")
    detail: str
    occurred_at: datetime
    actor: str = Field(description="operator:<id>, or <source>:<host>/<pid> of a process.")
    version: int | None = Field(description="The record's version after this request.")
    event: dict[str, Any] = Field(description="The request as appended.")
    chain_hash: str = Field(
        description="SHA-256 (hex) linking this entry to the previous entry of its key; "
        "`toolledger replay --verify` recomputes the chain."
    )

    @classmethod
    def of(cls, entry: HistoryEntry) -> HistoryItem:
        event = _parsed(entry.event_json)
        return cls(
            event_id=entry.event_id,
            event_type=entry.event_type,
            partition=entry.partition,
            offset=entry.offset,
            accepted=entry.accepted,
            reason=entry.reason,
            detail=entry.detail,
            occurred_at=entry.occurred_at,
            actor=entry.actor,
            version=entry.version,
            event=event if isinstance(event, dict) else {"value": event},
            chain_hash=entry.chain_hash,
        )


class ToolExecutionDetail(BaseModel):
    """A call and its full history."""

    record: ToolExecution
    history: list[HistoryItem]


class ToolExecutionPage(BaseModel):
    """A page of calls, longest-waiting first."""

    items: list[ToolExecution]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class CompensationResult(BaseModel):
    """The compensated call as it is now, and its compensation call `<key>:compensate`.

    `record.status` is `compensated` when the compensation completed, `completed` again (with
    the failure in `record.error` and the history) when it failed, and still `compensating`
    while the compensation call is unknown: resolve `<key>:compensate` to settle both.
    """

    record: ToolExecution
    compensation: ToolExecution | None


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable, for programs: e.g. version_mismatch, invalid_token.")
    message: str = Field(description="What was wrong and what to do, for people.")
    record: ToolExecution | None = Field(
        default=None, description="On a conflict: the call as it is now."
    )
    resolvable_after: datetime | None = Field(
        default=None, description="On before_deadline: when the call may be resolved."
    )


class ErrorResponse(BaseModel):
    """Every error response of the API."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "ready", "not_ready"]
    checks: dict[str, str] = Field(default_factory=dict)


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
