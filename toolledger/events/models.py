"""The requests that runtimes, operators and processors append to `toolledger.events`.

Every request is a frozen pydantic model with a common envelope. The log is the record of truth,
so these models are the product's durable API: each one has an Avro schema in
`toolledger/schemas/` and a released field is never removed or retyped, only added with a default
(see `toolledger.events.codec`).

Times are timezone-aware UTC with microsecond precision; the lifecycle decider reads time only
from these fields (`occurred_at`, `deadline`), never from a clock, so a replay folds the same way
years later.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from toolledger.events.ids import random_uuid

#: Version of the event schemas *and* of the decider's rules. A rule change that would fold an
#: old log differently ships with a new version; the recorded-log fixture test guards it.
#: Version 2: a late outcome that contradicts an operator's or reconcile hook's settlement
#: flags the call contested (`CONTESTED_SINCE`); a v1 event never does, so v1 logs fold as
#: they always did.
SCHEMA_VERSION = 2
#: The first event schema version whose late outcomes can contest a settled call.
CONTESTED_SINCE = 2

Source = Literal["runtime", "reconcile", "operator"]
ResolvedOutcome = Literal["completed", "failed"]
RunOutcome = Literal["completed", "failed", "cancelled"]
PauseReason = Literal["awaiting_reconciliation", "awaiting_approval", "duplicate_intent", "host"]


def utcnow() -> datetime:
    """Now, as the envelope stores it: UTC, truncated to microseconds."""
    return datetime.now(UTC)


#: Avro `long`: every integer in an event must fit in 64 signed bits.
Long = Annotated[int, Field(ge=0, le=2**63 - 1)]


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is UTC:  # the usual case (`utcnow`, a decoded timestamp): already so
        return value
    if value.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware (UTC)")
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]


def _no_colon(value: str) -> str:
    if ":" in value:
        raise ValueError("run_id must not contain ':' (it is the key separator)")
    if not value:
        raise ValueError("run_id must not be empty")
    return value


RunId = Annotated[str, AfterValidator(_no_colon)]


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _clean(value: Any) -> Any:
    """`value` with NUL and lone surrogates replaced, or `value` itself when it has none.

    Every event built or decoded passes here (nested models once more), so the usual case, all
    clean, allocates nothing: a container is rebuilt only when something in it changed.
    """
    if isinstance(value, str):
        if value.isascii() and "\x00" not in value:
            return value
        return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        for item in value.values():
            # Inline for the usual item, a clean string: one call per event, not one per field.
            if item.__class__ is str and item.isascii() and "\x00" not in item:
                continue
            if _clean(item) is not item:
                return {k: _clean(v) for k, v in value.items()}
        return value
    if isinstance(value, list | tuple):
        for item in value:
            if _clean(item) is not item:
                return type(value)(_clean(v) for v in value)
        return value
    return value


#: `json.dumps` with these arguments, made once: `dumps` builds an encoder per call otherwise.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that digests and signatures cover."""
    return _CANONICAL.encode(value)


def args_digest(arguments: Any) -> str:
    """SHA-256 of the canonical JSON of a call's arguments (the key-conflict fingerprint)."""
    return digest_of_canonical(canonical_json(arguments))


def digest_of_canonical(text: str) -> str:
    """`args_digest` of arguments whose canonical JSON is `text` (already made)."""
    return hashlib.sha256(text.encode()).hexdigest()


def call_key(run_id: str, tool_call_id: str) -> str:
    """The idempotency key of a call: `<run_id>:<tool_call_id>`."""
    return f"{run_id}:{tool_call_id}"


class _Storable(BaseModel):
    """Every string storable: PostgreSQL text cannot hold NUL and UTF-8 cannot hold a lone
    surrogate, and an event that cannot be stored would stall its partition forever. Such
    characters (from a tool's error message, say) become U+FFFD."""

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        return _clean(data)


class Producer(_Storable):
    """Which process appended the event (shown to auditors as the actor)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    pid: Long

    @classmethod
    def this_process(cls) -> Producer:
        """This process, made once per process id (a forked child gets its own): every event
        an envelope builds names it, and the model is frozen, so they share one."""
        pid = os.getpid()
        found = _THIS_PROCESS.get(pid)
        if found is None:
            _THIS_PROCESS.clear()
            found = _THIS_PROCESS[pid] = cls(host=socket.gethostname(), pid=pid)
        return found


_THIS_PROCESS: dict[int, Producer] = {}


class Signature(_Storable):
    """An Ed25519 signature (hex, in `mac`) over the event's canonical body by the operator key
    named `key_id` (`toolledger.events.signing`). The field keeps its name from the HMAC days:
    renaming it would be a new schema version for no reader's benefit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    mac: str


class Event(_Storable):
    """The envelope every request carries.

    `key` is `<run_id>:<tool_call_id>` for call events and the run_id for run events; the log is
    keyed by run_id, so a run and all its calls are totally ordered in one partition.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    event_id: uuid.UUID = Field(default_factory=random_uuid)
    key: str
    run_id: RunId
    tool_call_id: str | None = None
    tenant_id: str = Field(min_length=1)
    occurred_at: UtcDatetime = Field(default_factory=utcnow)
    producer: Producer = Field(default_factory=Producer.this_process)
    schema_version: Long = SCHEMA_VERSION

    def history_json(self) -> str:
        """The event as the ledger's history keeps it: JSON without the fields that are None.

        Fields are only ever added with a None default (Avro evolution), so an old event reads
        back to the same text after an upgrade, and a replay by a newer reader still has the
        same history digest as the ledger it checks.
        """
        return self.model_dump_json(exclude_none=True)

    @model_validator(mode="after")
    def _key_matches(self) -> Self:
        expected = (
            self.run_id if self.tool_call_id is None else call_key(self.run_id, self.tool_call_id)
        )
        if self.key != expected:
            raise ValueError(f"key {self.key!r} must be {expected!r} for this run_id/tool_call_id")
        return self


class CallEvent(Event):
    """An event about one tool call."""

    tool_call_id: str = Field(min_length=1)


class CallReserved(CallEvent):
    """A driver asks to run the call. `deadline` is when the runtime stops waiting for the tool."""

    type: Literal["call_reserved"] = "call_reserved"
    reservation_id: uuid.UUID = Field(default_factory=random_uuid)
    run_version: Long | None = None
    tool: str
    effect: Literal["read", "write", "external", "destructive"] = "write"
    args_digest: str
    arguments_json: str = "{}"
    requires_approval: bool = False
    deadline: UtcDatetime
    #: Set on the reservation of a compensation call (`<key>:compensate`): the key it undoes.
    #: Such a call is started by an operator, not by the run's driver, so it carries no run_version.
    compensates: str | None = None
    #: A warning the driver wants in the key's history (schema v2), e.g. a duplicate intent
    #: that policy allowed to run.
    warning: str | None = None
    #: Arguments too large to travel inline (schema v3): the SHA-256 of their text, stored as a
    #: blob in the ledger before this event was appended; `arguments_json` is then "".
    arguments_blob: str | None = None
    #: The W3C trace context (`traceparent`, `tracestate` headers) of the span that reserved the
    #: call (schema v3, with `arguments_blob`), so the projector's apply and a reconciler's
    #: attempt join the call's trace (docs/tracing.md). Never read by the decider.
    traceparent: str | None = None
    tracestate: str | None = None


class CallCompleted(CallEvent):
    """The tool returned (source runtime) or its reconcile hook found the effect (reconcile)."""

    type: Literal["call_completed"] = "call_completed"
    reservation_id: uuid.UUID
    result_json: str = "null"
    result_reference: str | None = None
    source: Literal["runtime", "reconcile"] = "runtime"
    expected_version: Long | None = None
    #: A result too large to travel inline (schema v2): the SHA-256 of its text, stored as a
    #: blob in the ledger before this event was appended; `result_json` is then "".
    result_blob: str | None = None


class CallFailed(CallEvent):
    """The call definitely did not take effect (or a reconcile hook proved so)."""

    type: Literal["call_failed"] = "call_failed"
    reservation_id: uuid.UUID
    error: str
    error_type: str | None = None
    not_attempted: bool = False
    source: Literal["runtime", "reconcile"] = "runtime"
    expected_version: Long | None = None


class CallIndeterminate(CallEvent):
    """The request may have left and no answer came back: nobody knows whether it took effect."""

    type: Literal["call_indeterminate"] = "call_indeterminate"
    reservation_id: uuid.UUID
    error: str
    error_type: str | None = None


class CallAbandoned(CallEvent):
    """The runtime gave up waiting for its reservation's verdict and never ran the tool."""

    type: Literal["call_abandoned"] = "call_abandoned"
    reservation_id: uuid.UUID


class ReconcileAttempted(CallEvent):
    """A reconcile hook ran and could not tell; kept as evidence for operators."""

    type: Literal["reconcile_attempted"] = "reconcile_attempted"
    reservation_id: uuid.UUID
    expected_version: Long
    attempt: Long
    detail: str = ""


#: Operator-event fields added after v1 (see `OperatorEvent.signing_body`).
_SIGNED_SINCE_V1 = ("value_blob",)


class OperatorEvent(CallEvent):
    """A decision by a person, signed by the operator API so a runtime cannot forge one."""

    operator: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    expected_version: Long
    signature: Signature | None = None

    def signing_body(self) -> bytes:
        """The bytes the signature covers: the canonical JSON of everything but the signature.

        Fields added after v1 are left out while they are None, so the body of an event that
        does not use them is byte for byte what it was when it was signed, and old signatures
        in the log still verify after an upgrade.
        """
        body = self.model_dump(mode="json", exclude={"signature"})
        for name in _SIGNED_SINCE_V1:
            if body.get(name, 0) is None:
                del body[name]
        return canonical_json(body).encode()


class CallResolved(OperatorEvent):
    """An operator settles an unknown (or overdue started) call."""

    type: Literal["call_resolved"] = "call_resolved"
    outcome: ResolvedOutcome
    value_json: str | None = None
    result_reference: str | None = None
    #: A value too large to travel inline (schema v2), as `CallCompleted.result_blob`. The
    #: signature covers the digest, which covers the text.
    value_blob: str | None = None


class CallApproved(OperatorEvent):
    """An operator lets a call that requires approval run."""

    type: Literal["call_approved"] = "call_approved"


class CallRejected(OperatorEvent):
    """An operator refuses a call that requires approval: failed, not attempted."""

    type: Literal["call_rejected"] = "call_rejected"


class CompensationRequested(OperatorEvent):
    """An operator asks to undo a completed call (the only way compensation ever starts)."""

    type: Literal["compensation_requested"] = "compensation_requested"


class CallCompensated(CallEvent):
    """The compensation call (`<key>:compensate`) completed."""

    type: Literal["call_compensated"] = "call_compensated"
    compensation_key: str
    result_json: str = "null"


class CompensationFailed(CallEvent):
    """The compensation call failed definitely; the original effect stands."""

    type: Literal["compensation_failed"] = "compensation_failed"
    compensation_key: str
    error: str


class RunEvent(Event):
    """An event about a run as a whole (key = run_id)."""

    tool_call_id: None = None


class RunStarted(RunEvent):
    """A run driven with checkpoints begins (version 0); its tenant is bound."""

    type: Literal["run_started"] = "run_started"
    agent: str = ""


class RunCheckpointed(RunEvent):
    """The driver saved the transcript and lists the tool calls it is about to make."""

    type: Literal["run_checkpointed"] = "run_checkpointed"
    expected_version: Long
    tool_call_ids: tuple[str, ...] = ()
    state_json: str = "{}"
    #: A transcript too large to travel inline (schema v2), as `CallCompleted.result_blob`.
    state_blob: str | None = None


class RunPaused(RunEvent):
    """The run waits: on an unknown call, an approval, a duplicate intent, or its host."""

    type: Literal["run_paused"] = "run_paused"
    #: The checkpoint the driver holds; None (schema v2) for a run its framework drives
    #: without checkpoints (a LangGraph thread, a PydanticAI or OpenAI Agents run).
    expected_version: Long | None = None
    reason: PauseReason
    waiting_on: str | None = None


class RunResumed(RunEvent):
    """The run's driver carries on after a pause."""

    type: Literal["run_resumed"] = "run_resumed"
    #: As `RunPaused.expected_version`: None for a run without checkpoints (schema v2).
    expected_version: Long | None = None


class RunResumeFailed(RunEvent):
    """The resumer gave up on a paused run whose wait is over: the host's resume hook raised
    `attempts` times in a row, the last time with `error`. The run stays paused and is marked
    with the error until its driver moves it on (a resume, a checkpoint, its end); a resumer
    that starts tries every run whose wait is over again. Appended by `toolledger resumer`."""

    type: Literal["run_resume_failed"] = "run_resume_failed"
    #: The call the pause waits on: a mark about an older pause of the run is rejected.
    waiting_on: str
    attempts: Long
    error: str


class RunFinished(RunEvent):
    """The run ended; it reserves no more calls."""

    type: Literal["run_finished"] = "run_finished"
    expected_version: Long
    outcome: RunOutcome
    detail: str = ""


AnyEvent = Annotated[
    CallReserved
    | CallCompleted
    | CallFailed
    | CallIndeterminate
    | CallAbandoned
    | ReconcileAttempted
    | CallResolved
    | CallApproved
    | CallRejected
    | CompensationRequested
    | CallCompensated
    | CompensationFailed
    | RunStarted
    | RunCheckpointed
    | RunPaused
    | RunResumed
    | RunResumeFailed
    | RunFinished,
    Field(discriminator="type"),
]

EVENT_TYPES: tuple[type[Event], ...] = (
    CallReserved,
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallAbandoned,
    ReconcileAttempted,
    CallResolved,
    CallApproved,
    CallRejected,
    CompensationRequested,
    CallCompensated,
    CompensationFailed,
    RunStarted,
    RunCheckpointed,
    RunPaused,
    RunResumed,
    RunResumeFailed,
    RunFinished,
)
