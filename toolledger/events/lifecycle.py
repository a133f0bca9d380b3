"""The lifecycle decider: which event sequences are legal, as one pure function.

`decide(run, call, event, keys=...)` looks at the current run and call records and one request
and returns a `Verdict`: accepted or rejected, why, and the records as they stand afterwards.
Every projection (PostgreSQL, memory) and every replay folds the log through this function and
nothing else, so they cannot disagree. It does no I/O and reads no clock: the only notion of time
is the event's `occurred_at` and the reservation's `deadline`.

The rules are the table in docs/architecture.md, "The decider". Their version is
`toolledger.events.models.SCHEMA_VERSION`; the recorded-log fixture test fails when a change
would fold an old log differently.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import assert_never

from toolledger.events.models import (
    CONTESTED_SINCE,
    CallAbandoned,
    CallApproved,
    CallCompensated,
    CallCompleted,
    CallEvent,
    CallFailed,
    CallIndeterminate,
    CallRejected,
    CallReserved,
    CallResolved,
    CompensationFailed,
    CompensationRequested,
    Event,
    OperatorEvent,
    ReconcileAttempted,
    RunCheckpointed,
    RunFinished,
    RunPaused,
    RunResumed,
    RunResumeFailed,
    RunStarted,
)
from toolledger.events.records import (
    SETTLED,
    UNSETTLED,
    CallRecord,
    Reason,
    RunRecord,
    Verdict,
)
from toolledger.events.signing import VerifyKeys
from toolledger.events.trusted import build, replace

#: How long after a reservation's deadline a `started` call may be settled by someone other than
#: its runtime. Covers clock skew between the runtime that set the deadline and whoever settles.
CLOCK_SKEW_GRACE = timedelta(seconds=5)


def open_until(call: CallRecord) -> datetime:
    """Until when a `started` call may still be running: its deadline plus `CLOCK_SKEW_GRACE`."""
    return call.deadline + CLOCK_SKEW_GRACE


def may_still_run(call: CallRecord, at: datetime) -> bool:
    """Whether `call` may still be running at `at`: it is `started` and not past `open_until`.

    While it may, only its own runtime settles it: a reconcile finding `failed` and an
    operator's resolution are rejected (`before_deadline`), a replay answers "in progress".
    """
    return call.status == "started" and at <= open_until(call)


def lapsed_before(now: datetime) -> datetime:
    """The deadline before which a `started` call no longer may run at `now` (`may_still_run`
    as a bound on stored deadlines, for the queries that list or count such calls)."""
    return now - CLOCK_SKEW_GRACE


_FINISHED = frozenset({"completed", "failed", "cancelled"})


def _signature_problem(event: OperatorEvent, keys: VerifyKeys) -> tuple[Reason, str] | None:
    """Unsigned or not matching a known public key: rejected. An unknown key id raises
    `UnknownSigningKey` (the fold stops; see `toolledger.events.signing`)."""
    if event.signature is None:
        return (
            "unsigned",
            f"operator event for {event.key} is not signed; only the API may append it",
        )
    if not keys.verify(event):
        return (
            "bad_signature",
            f"operator event for {event.key} has a signature that does not match the public "
            f"key {event.signature.key_id!r}",
        )
    return None


def decide(
    run: RunRecord | None,
    call: CallRecord | None,
    event: Event,
    *,
    keys: VerifyKeys | None = None,
) -> Verdict:
    """Decide one request against the current run and call records.

    `call` must be the record of `event.key` (None for run events or unknown keys) and `run` the
    record of `event.run_id`. `keys` are the operator-signature public keys by key id; an
    operator event signed with a key id not among them raises `UnknownSigningKey`.
    """
    d = _Decision(run, call, event)
    if run is not None and run.quarantined:
        return d.reject(
            "quarantined",
            f"run {event.run_id} is quarantined ({run.quarantine_reason}); an operator must "
            "inspect `toolledger dead-letters list` before its events are applied",
        )
    if run is not None and run.tenant_id is not None and run.tenant_id != event.tenant_id:
        return d.reject(
            "tenant_mismatch",
            f"run {event.run_id} belongs to another tenant than {event.tenant_id}",
        )
    if isinstance(event, OperatorEvent):
        problem = _signature_problem(event, keys or VerifyKeys())
        if problem is not None:
            return d.reject(*problem)
    return _dispatch(d, event)


def _dispatch(d: _Decision, event: Event) -> Verdict:
    match event:
        case CallReserved():
            return _reserved(d, event)
        case CallCompleted(source="reconcile") | CallFailed(source="reconcile"):
            return _reconcile_finding(d, event)
        case ReconcileAttempted():
            return _reconcile_finding(d, event)
        case CallCompleted() | CallFailed() | CallIndeterminate():
            return _runtime_outcome(d, event)
        case CallAbandoned():
            return _abandoned(d, event)
        case CallResolved() | CallApproved() | CallRejected() | CompensationRequested():
            return _operator(d, event)
        case CallCompensated() | CompensationFailed():
            return _compensation_outcome(d, event)
        case RunStarted() | RunCheckpointed() | RunPaused() | RunResumed() | RunFinished():
            return _run_event(d, event)
        case RunResumeFailed():
            return _resume_failed(d, event)
    raise TypeError(f"the decider has no rule for event type {event.type!r}")


class _Decision:
    """Builds verdicts for one event; keeps `decide` free of repeated boilerplate."""

    def __init__(self, run: RunRecord | None, call: CallRecord | None, event: Event) -> None:
        self.run = run
        self.call = call
        self.event = event

    def reject(self, reason: Reason, detail: str, call: CallRecord | None = None) -> Verdict:
        """A rejection; `call` is given only by the one rule that flags a record on rejecting
        (a contradicting late outcome marks the call contested)."""
        return self._verdict(False, reason, detail, call or self.call, self.run)

    def accept(
        self, detail: str, call: CallRecord | None = None, run: RunRecord | None = None
    ) -> Verdict:
        return self._verdict(True, "accepted", detail, call or self.call, run or self._bound_run())

    def update_call(self, **changes: object) -> CallRecord:
        """The current call record with `changes`, one version later (not validated again:
        every value comes from a validated event or record, `toolledger.events.trusted`)."""
        assert self.call is not None
        changes["version"] = self.call.version + 1
        changes["updated_at"] = self.event.occurred_at
        return replace(self.call, changes)

    def _bound_run(self) -> RunRecord:
        """The run record after an accepted call event: the first one binds the tenant."""
        if self.run is not None:
            return self.run
        return new_run(self.event.run_id, self.event.tenant_id, self.event.occurred_at)

    def _verdict(
        self,
        accepted: bool,
        reason: Reason,
        detail: str,
        call: CallRecord | None,
        run: RunRecord | None,
    ) -> Verdict:
        event = self.event
        return build(
            Verdict,
            {
                "event_id": event.event_id,
                "event_type": event.type,
                "key": event.key,
                "run_id": event.run_id,
                "accepted": accepted,
                "reason": reason,
                "detail": detail,
                "call": call,
                "run": run,
            },
        )


def new_run(run_id: str, tenant_id: str | None, at: datetime | None) -> RunRecord:
    """A run's first record (running, no checkpoint yet), as `RunRecord(...)` would make it."""
    return build(
        RunRecord,
        {
            "run_id": run_id,
            "tenant_id": tenant_id,
            "version": None,
            "status": "running",
            "agent": "",
            "checkpoint_calls": (),
            "state_json": "{}",
            "state_blob": None,
            "waiting_on": None,
            "abandoned": (),
            "quarantined": False,
            "quarantine_reason": None,
            "updated_at": at,
            "resume_error": None,
        },
    )


def _new_call(e: CallReserved) -> CallRecord:
    """The record an accepted first reservation creates, as `CallRecord(...)` would make it."""
    return build(
        CallRecord,
        {
            "key": e.key,
            "run_id": e.run_id,
            "tool_call_id": e.tool_call_id,
            "tenant_id": e.tenant_id,
            "tool": e.tool,
            "effect": e.effect,
            "status": "awaiting_approval" if e.requires_approval else "started",
            "version": 1,
            "reservation_id": e.reservation_id,
            "args_digest": e.args_digest,
            "arguments_json": e.arguments_json,
            "requires_approval": e.requires_approval,
            "deadline": e.deadline,
            "not_attempted": False,
            "result_json": None,
            "result_reference": None,
            "error": None,
            "settled_by": None,
            "operator": None,
            "reason": None,
            "reconcile_attempts": 0,
            "contested": False,
            "contested_evidence": None,
            "arguments_blob": e.arguments_blob,
            "result_blob": None,
            "created_at": e.occurred_at,
            "updated_at": e.occurred_at,
        },
    )


def _fence(d: _Decision, e: CallReserved) -> Verdict | None:
    """Run fencing (guarantee 8): only the holder of the latest checkpoint may reserve."""
    run = d.run
    if e.compensates is not None:
        return None  # an operator's compensation, not a step of the run's driver
    if run is None or run.version is None:
        if e.run_version is not None:
            return d.reject(
                "unknown_run",
                f"reservation of {e.key} claims run version {e.run_version}, but run {e.run_id} "
                "has no checkpoint",
            )
        return None
    if run.status in _FINISHED:
        return d.reject(
            "run_finished", f"run {e.run_id} is {run.status}; it reserves no more calls"
        )
    if e.run_version is None:
        return d.reject(
            "missing_run_version",
            f"run {e.run_id} is driven with checkpoints; reserve {e.key} with its run_version",
        )
    if e.run_version != run.version or e.tool_call_id not in run.checkpoint_calls:
        return d.reject(
            "stale_driver",
            f"run {e.run_id} is at checkpoint {run.version} (calls {list(run.checkpoint_calls)}); "
            f"a driver at version {e.run_version} was superseded and must stand down",
        )
    return None


def _reserved(d: _Decision, e: CallReserved) -> Verdict:
    fenced = _fence(d, e)
    if fenced is not None:
        return fenced
    if d.run is not None and str(e.reservation_id) in d.run.abandoned:
        return d.reject(
            "abandoned_reservation",
            f"reservation {e.reservation_id} of {e.key} was abandoned by its runtime before it "
            "arrived; it will never run",
        )
    call = d.call
    if call is None:
        return d.accept(_with_warning(f"{e.key} reserved", e), _new_call(e))
    if call.args_digest != e.args_digest:
        return d.reject(
            "key_conflict",
            f"{e.key} was reserved with different arguments (digest {call.args_digest[:12]}); "
            "a new call needs a new tool_call_id",
        )
    if call.status == "completed":
        return d.reject("already_completed", f"{e.key} already completed; its result is recorded")
    if call.contested:
        return d.reject(
            "contested",
            f"{e.key} is contested: settled {call.status} by {call.settled_by}, then "
            f"{call.contested_evidence}; it does not run again until an operator resolves it "
            f"again (expected_version {call.version})",
        )
    if call.status not in ("failed", "approved"):
        return d.reject(
            "held",
            f"{e.key} is {call.status} under reservation {call.reservation_id}; another driver "
            "holds it",
        )
    approved = call.status == "approved"
    new = d.update_call(
        status="awaiting_approval" if e.requires_approval and not approved else "started",
        reservation_id=e.reservation_id,
        tool=e.tool,
        effect=e.effect,
        arguments_json=e.arguments_json,
        arguments_blob=e.arguments_blob,
        requires_approval=e.requires_approval,
        deadline=e.deadline,
        not_attempted=False,
        result_json=None,
        result_reference=None,
        result_blob=None,
        error=None,
        settled_by=None,
        operator=call.operator if approved else None,
        reason=call.reason if approved else None,
        reconcile_attempts=0,
    )
    return d.accept(_with_warning(f"{e.key} reserved again after {call.status}", e), new)


def _with_warning(detail: str, e: CallReserved) -> str:
    return detail if e.warning is None else f"{detail}; warning: {e.warning}"


def _late(d: _Decision, e: CallEvent, call: CallRecord, detail: str) -> Verdict:
    """A late outcome for the call's own reservation: rejected (a late outcome never overwrites
    a settled one), and if it contradicts a settlement made by an operator or a reconcile hook
    (schema v2 on), the call is flagged contested so the contradiction cannot be rerun away."""
    if not _contradicts(call, e):
        return d.reject("late_outcome", detail)
    evidence = (
        f"a late {e.type} from {getattr(e, 'source', 'runtime')} "
        f"{e.producer.host}/{e.producer.pid} at {e.occurred_at.isoformat()} (event {e.event_id})"
    )
    flagged = d.update_call(contested=True, contested_evidence=evidence)
    return d.reject(
        "late_outcome",
        f"{detail}; it contradicts the {call.settled_by}'s decision, so {e.key} is contested "
        "until an operator decides again",
        flagged,
    )


def _contradicts(call: CallRecord, e: CallEvent) -> bool:
    if call.contested or e.schema_version < CONTESTED_SINCE:
        return False
    if call.settled_by not in ("operator", "reconcile"):
        return False
    if call.reservation_id != getattr(e, "reservation_id", None):
        return False
    if call.status == "failed":
        return isinstance(e, CallCompleted)
    return call.status == "completed" and isinstance(e, CallFailed)


def _current(d: _Decision, e: CallEvent, reservation_id: object) -> Verdict | CallRecord:
    """The call record if `reservation_id` is its current reservation, else the rejection."""
    call = d.call
    if call is None:
        return d.reject("unknown_call", f"no reservation of {e.key} was accepted")
    if call.reservation_id != reservation_id:
        if call.status in SETTLED or call.status in ("compensating",):
            return d.reject(
                "late_outcome",
                f"{e.key} is already {call.status}; this outcome of an old reservation is kept "
                "as evidence and ignored",
            )
        return d.reject(
            "not_current_reservation",
            f"{e.key} is held by reservation {call.reservation_id}, not {reservation_id}",
        )
    return call


def _runtime_outcome(d: _Decision, e: CallCompleted | CallFailed | CallIndeterminate) -> Verdict:
    call = _current(d, e, e.reservation_id)
    if isinstance(call, Verdict):
        return call
    if call.status != "started":
        return _late(
            d,
            e,
            call,
            f"{e.key} is already {call.status} (settled by {call.settled_by or 'nobody yet'}); "
            "this late outcome is kept as evidence and ignored",
        )
    match e:
        case CallCompleted():
            new = d.update_call(
                status="completed",
                result_json=e.result_json,
                result_reference=e.result_reference,
                result_blob=e.result_blob,
                settled_by="runtime",
            )
        case CallFailed():
            new = d.update_call(
                status="failed",
                error=e.error,
                not_attempted=e.not_attempted,
                settled_by="runtime",
            )
        case CallIndeterminate():
            new = d.update_call(status="indeterminate", error=e.error)
        case _:
            assert_never(e)
    return d.accept(f"{e.key} {new.status}", new)


def _reconcile_finding(d: _Decision, e: CallCompleted | CallFailed | ReconcileAttempted) -> Verdict:
    call = _current(d, e, e.reservation_id)
    if isinstance(call, Verdict):
        return call
    if call.status not in UNSETTLED:
        return _late(
            d,
            e,
            call,
            f"{e.key} is already {call.status}; this reconcile finding is kept as evidence",
        )
    if e.expected_version != call.version:
        return d.reject(
            "version_mismatch",
            f"{e.key} is at version {call.version}, the finding expected {e.expected_version}",
        )
    if isinstance(e, CallFailed) and may_still_run(call, e.occurred_at):
        return d.reject(
            "before_deadline",
            f"{e.key} may still be running until {open_until(call).isoformat()}; it cannot be "
            "settled failed before then",
        )
    match e:
        case CallCompleted():
            new = d.update_call(
                status="completed",
                result_json=e.result_json,
                result_reference=e.result_reference,
                result_blob=e.result_blob,
                settled_by="reconcile",
                error=None,
            )
        case CallFailed():
            new = d.update_call(
                status="failed",
                error=e.error,
                not_attempted=e.not_attempted,
                settled_by="reconcile",
            )
        case ReconcileAttempted():
            new = d.update_call(reconcile_attempts=call.reconcile_attempts + 1)
        case _:
            assert_never(e)
    return d.accept(f"{e.key} reconcile: {e.type}", new)


def _abandoned(d: _Decision, e: CallAbandoned) -> Verdict:
    run = d._bound_run()
    tomb = str(e.reservation_id)
    run = replace(run, {"abandoned": (*run.abandoned, tomb)}) if tomb not in run.abandoned else run
    call = d.call
    if call is not None and call.reservation_id == e.reservation_id:
        if call.status not in ("started", "awaiting_approval", "approved"):
            return d.reject("late_outcome", f"{e.key} is already {call.status}; abandon ignored")
        new = d.update_call(
            status="failed",
            not_attempted=True,
            error="abandoned: the runtime got no verdict in time and never ran the tool",
            settled_by="runtime",
        )
        return d.accept(f"{e.key} abandoned before it ran", new, run)
    return d.accept(f"reservation {tomb} of {e.key} tombstoned", call, run)


def _operator(
    d: _Decision, e: CallResolved | CallApproved | CallRejected | CompensationRequested
) -> Verdict:
    call = d.call
    if call is None:
        return d.reject("unknown_call", f"no call {e.key} in the ledger")
    if isinstance(e, CompensationRequested) and call.status == "failed":
        return d.reject("nothing_to_undo", f"{e.key} failed; there is no effect to compensate")
    wanted = {
        "call_resolved": UNSETTLED,
        "call_approved": frozenset({"awaiting_approval"}),
        "call_rejected": frozenset({"awaiting_approval"}),
        "compensation_requested": frozenset({"completed"}),
    }[e.type]
    contested_resolve = isinstance(e, CallResolved) and call.contested
    if call.status not in wanted and not contested_resolve:
        return d.reject(
            "status_mismatch",
            f"{e.key} is {call.status} (version {call.version}); {e.type} needs it "
            f"{' or '.join(sorted(wanted))}",
        )
    if e.expected_version != call.version:
        return d.reject(
            "version_mismatch",
            f"{e.key} moved to version {call.version} ({call.status}); the operator saw "
            f"version {e.expected_version}",
        )
    who: dict[str, object] = {"settled_by": "operator", "operator": e.operator, "reason": e.reason}
    if contested_resolve:
        who |= {"contested": False, "contested_evidence": None}
    match e:
        case CallResolved():
            if may_still_run(call, e.occurred_at):
                return d.reject(
                    "before_deadline",
                    f"{e.key} is started and may still be running; resolve it after "
                    f"{open_until(call).isoformat()}",
                )
            if e.outcome == "completed":
                new = d.update_call(
                    status="completed",
                    result_json=e.value_json if e.value_json is not None else "null",
                    result_reference=e.result_reference,
                    result_blob=e.value_blob,
                    **who,
                )
            else:
                new = d.update_call(status="failed", error=e.reason, **who)
        case CallApproved():
            new = d.update_call(status="approved", operator=e.operator, reason=e.reason)
        case CallRejected():
            new = d.update_call(status="failed", not_attempted=True, error=e.reason, **who)
        case CompensationRequested():
            new = d.update_call(status="compensating", operator=e.operator, reason=e.reason)
        case _:
            assert_never(e)
    return d.accept(f"{e.key} {e.type} by {e.operator}", new)


def _compensation_outcome(d: _Decision, e: CallCompensated | CompensationFailed) -> Verdict:
    call = d.call
    if call is None:
        return d.reject("unknown_call", f"no call {e.key} in the ledger")
    if call.status != "compensating":
        return d.reject(
            "status_mismatch", f"{e.key} is {call.status}; no compensation is in progress"
        )
    match e:
        case CallCompensated():
            new = d.update_call(status="compensated")
        case CompensationFailed():
            new = d.update_call(status="completed", error=f"compensation failed: {e.error}")
        case _:
            assert_never(e)
    return d.accept(f"{e.key} {new.status}", new)


def _run_event(
    d: _Decision, e: RunStarted | RunCheckpointed | RunPaused | RunResumed | RunFinished
) -> Verdict:
    run = d.run
    if isinstance(e, RunStarted):
        if run is not None and run.version is not None:
            return d.reject("run_exists", f"run {e.run_id} was already started")
        base = d._bound_run()
        new = replace(
            base, {"version": 0, "status": "running", "agent": e.agent, "updated_at": e.occurred_at}
        )
        return d.accept(f"run {e.run_id} started", run=new)
    if isinstance(e, RunPaused | RunResumed) and (run is None or run.version is None):
        return _framework_pause(d, e)
    if run is None or run.version is None:
        return d.reject("unknown_run", f"run {e.run_id} was never started with checkpoints")
    if run.status in _FINISHED:
        return d.reject("run_finished", f"run {e.run_id} is {run.status}")
    if e.expected_version != run.version:
        return d.reject(
            "stale_driver",
            f"run {e.run_id} is at checkpoint {run.version}; a driver at {e.expected_version} "
            "was superseded and must stand down",
        )
    match e:
        case RunCheckpointed():
            update: dict[str, object] = {
                "version": run.version + 1,
                "status": "running",
                "checkpoint_calls": e.tool_call_ids,
                "state_json": e.state_json,
                "state_blob": e.state_blob,
                "waiting_on": None,
            }
        case RunPaused():
            status = "paused" if e.reason == "host" else e.reason
            update = {"status": status, "waiting_on": e.waiting_on}
        case RunResumed():
            update = {"status": "running", "waiting_on": None}
        case RunFinished():
            update = {"status": e.outcome, "waiting_on": None}
        case _:
            assert_never(e)
    update["updated_at"] = e.occurred_at
    update["resume_error"] = None
    new = replace(run, update)
    return d.accept(f"run {e.run_id} {e.type}", run=new)


def _framework_pause(d: _Decision, e: RunPaused | RunResumed) -> Verdict:
    """A pause or resume of a run its framework drives (no checkpoints: a LangGraph thread, a
    PydanticAI or OpenAI Agents run). The framework fences its own drivers (guarantee 8 is
    not offered), so there is no version to compare: the event carries none. The run exists
    once one of its calls was reserved, and a pause names the call it waits on."""
    run = d.run
    if e.expected_version is not None:
        return d.reject(
            "unknown_run",
            f"run {e.run_id} was never started with checkpoints; a driver at checkpoint "
            f"{e.expected_version} does not drive it",
        )
    if run is None:
        return d.reject(
            "unknown_run", f"run {e.run_id} has no calls yet: there is nothing it could wait on"
        )
    if isinstance(e, RunPaused):
        if e.waiting_on is None:
            return d.reject(
                "unknown_call",
                f"a pause of run {e.run_id}, which has no checkpoints, must name the call it "
                "waits on",
            )
        status = "paused" if e.reason == "host" else e.reason
        update: dict[str, object] = {"status": status, "waiting_on": e.waiting_on}
    else:
        update = {"status": "running", "waiting_on": None}
    update["updated_at"] = e.occurred_at
    update["resume_error"] = None
    return d.accept(f"run {e.run_id} {e.type}", run=replace(run, update))


def _resume_failed(d: _Decision, e: RunResumeFailed) -> Verdict:
    """The resumer marks a paused run whose resume hook kept failing. Only the pause it was
    about: a run that moved on (resumed, paused on another call, finished) is not marked."""
    run = d.run
    if run is None:
        return d.reject("unknown_run", f"run {e.run_id} is not in the ledger")
    if run.status in _FINISHED:
        return d.reject("run_finished", f"run {e.run_id} is {run.status}")
    if run.waiting_on != e.waiting_on:
        return d.reject(
            "status_mismatch",
            f"run {e.run_id} is {run.status}"
            + (f", waiting on {run.waiting_on}" if run.waiting_on else "")
            + f"; its resume failure while waiting on {e.waiting_on} is out of date",
        )
    error = (
        f"the resume hook failed {e.attempts} time{'s' if e.attempts != 1 else ''} "
        f"after {e.waiting_on} was settled; last error: {e.error}"
    )
    new = replace(run, {"resume_error": error, "updated_at": e.occurred_at})
    return d.accept(f"run {e.run_id} marked: {error}", run=new)
