"""What a call answers when its key is already in the ledger, or another holder won it.

A replay is the same key asked again: after a crash, by a second driver, or simply twice. The
rules, in the order `Ledger.call` applies them:

- other arguments than recorded: `KeyConflictError`; the tool does not run;
- `completed` (or compensated since): the recorded result, restored to the declared type;
- `failed` and contested (a late outcome said it took effect): `ToolCallContested`, naming
  the decision and the evidence; it does not run until an operator decides again;
- `failed` or `approved`: nothing to answer here; the call reserves again and runs;
- `awaiting_approval`: `ToolCallAwaitingApproval`;
- `started` or `indeterminate`: nobody knows whether it took effect. If the tool has a reconcile
  hook it is asked first: `completed` is recorded (source `reconcile`) and its result returned,
  as if the crash never happened; `failed` is recorded only when the decider would accept it
  (the call is `indeterminate`, or `started` past its deadline plus the clock-skew grace);
  otherwise the answer is `ToolCallInProgress` while a `started` call may still finish, and
  `ToolCallIndeterminate` after, naming the command that settles it.

A reservation the decider rejected is told the truth too (`lost_reservation`): "held" means
another reservation of the key is running, so under run fencing this driver is superseded, and
without fencing it waits (bounded by the verdict timeout) for that call to settle and returns
its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any, TypeVar

from toolledger.events.lifecycle import CLOCK_SKEW_GRACE
from toolledger.events.models import CallCompleted, CallEvent, CallFailed
from toolledger.events.payloads import bounded_text
from toolledger.events.records import UNSETTLED, CallRecord, Verdict
from toolledger.runtime.access import LedgerAccess
from toolledger.runtime.context import ToolContext
from toolledger.runtime.errors import (
    KeyConflictError,
    RunQuarantined,
    RunSuperseded,
    TenantMismatchError,
    ToolCallContested,
    ToolCallIndeterminate,
    ToolCallInProgress,
    call_label,
)
from toolledger.runtime.executor import CallIdentity
from toolledger.runtime.outcome import ToolOutcome, recorded_outcome, settled_outcome
from toolledger.runtime.tools import PreparedCall, ReconcileOutcome, Tool

log = logging.getLogger("toolledger.runtime")

T = TypeVar("T")

#: How often a call that lost its reservation re-reads the key while waiting for it to settle.
SETTLE_POLL_S = 0.05
#: How many times a reconcile finding is made again after the record moved on under it.
_FINDING_ATTEMPTS = 3


async def replay_known(
    io: LedgerAccess,
    tool: Tool[Any, T],
    prepared: PreparedCall,
    who: CallIdentity,
    record: CallRecord,
) -> ToolOutcome[T] | None:
    """The answer for a key already in the ledger, or None when the call should reserve."""
    if record.args_digest != prepared.digest:
        raise KeyConflictError(
            key=who.key, tool=tool.name, recorded=record.args_digest, given=prepared.digest
        )
    if record.status == "failed" and record.contested:
        raise ToolCallContested(record, tool=tool.name)
    if record.status in ("failed", "approved"):
        return None
    if record.status in ("started", "indeterminate"):
        return await _reconcile(io, tool, who, record)
    return settled_outcome(tool, record, replayed=True)


async def _reconcile(
    io: LedgerAccess, tool: Tool[Any, T], who: CallIdentity, record: CallRecord
) -> ToolOutcome[T]:
    open_until = record.deadline + CLOCK_SKEW_GRACE
    if tool.reconcile is not None:
        found = await _ask_hook(io, tool, who, record)
        record = await _settle_finding(io, tool, who, record, found)
        outcome = settled_outcome(tool, record, replayed=True)
        if outcome is not None:
            return outcome
    if record.status == "started" and io.clock() <= open_until:
        raise ToolCallInProgress(key=who.key, tool=tool.name, open_until=open_until)
    raise ToolCallIndeterminate(record, tool=tool.name)


async def _settle_finding(
    io: LedgerAccess,
    tool: Tool[Any, Any],
    who: CallIdentity,
    record: CallRecord,
    found: ReconcileOutcome,
) -> CallRecord:
    """Record the hook's finding; the record as the ledger has it afterwards.

    The finding expects the version the hook was asked about. If the call moved on meanwhile
    under the same reservation and is still unsettled (typically its own late outcome landed:
    the `indeterminate` a caller that gave up left behind), the finding is stale only in its
    version, not in its evidence, so it is made again against the new one (a few times at
    most, each for a real change of the record).
    """
    for _ in range(_FINDING_ATTEMPTS):
        finding = _finding(io, tool, who, record, found)
        if finding is None:
            return record
        verdict = await io.settle(finding)
        now = verdict.call or record
        if verdict.accepted:
            return now
        log.info("reconcile finding for %s not applied: %s", who.key, verdict.detail)
        moved_on = verdict.reason == "version_mismatch" and now.status in UNSETTLED
        if not moved_on or now.reservation_id != record.reservation_id:
            return now
        record = now
    return record


def _finding(
    io: LedgerAccess,
    tool: Tool[Any, Any],
    who: CallIdentity,
    record: CallRecord,
    found: ReconcileOutcome,
) -> CallEvent | None:
    """The finding to append for what the hook found, or None if there is none to record: an
    unknown answer, or `failed` while a `started` call may still be running."""
    now = io.clock()
    envelope = io.envelope(who, now)
    if found.status == "completed":
        return CallCompleted(
            **envelope,
            reservation_id=record.reservation_id,
            result_json=tool.dump_result(found.value),
            result_reference=found.result_reference,
            source="reconcile",
            expected_version=record.version,
        )
    open_until = record.deadline + CLOCK_SKEW_GRACE
    if found.status == "failed" and (record.status == "indeterminate" or now > open_until):
        return CallFailed(
            **envelope,
            reservation_id=record.reservation_id,
            error=bounded_text(found.detail) or "the reconcile hook found no effect",
            source="reconcile",
            expected_version=record.version,
        )
    return None


async def _ask_hook(
    io: LedgerAccess, tool: Tool[Any, Any], who: CallIdentity, record: CallRecord
) -> ReconcileOutcome:
    """The hook's finding; a hook that fails or overruns the tool's timeout knows nothing."""
    assert tool.reconcile is not None
    context = ToolContext(
        run_id=who.run_id,
        tool_call_id=who.tool_call_id,
        tenant_id=who.tenant_id,
        attempt=1,
        deadline=io.clock() + timedelta(seconds=tool.timeout),
        tool=tool.name,
        idempotency_key=who.key,
    )
    try:
        async with asyncio.timeout(tool.timeout):
            found = await tool.reconcile(record, context)
    except Exception as exc:
        log.warning("reconcile hook of %s failed for %s (%r); unknown", tool.name, who.key, exc)
        return ReconcileOutcome(status="unknown", detail=f"the hook failed: {exc!r}")
    if not isinstance(found, ReconcileOutcome):
        log.warning("reconcile hook of %s returned %r, not a ReconcileOutcome", tool.name, found)
        return ReconcileOutcome(status="unknown", detail="the hook returned no ReconcileOutcome")
    return found


async def lost_reservation(
    io: LedgerAccess,
    tool: Tool[Any, T],
    prepared: PreparedCall,
    who: CallIdentity,
    verdict: Verdict,
    run_version: int | None,
) -> ToolOutcome[T]:
    """The truth, or the error, for a reservation the decider rejected."""
    record = verdict.call
    match verdict.reason:
        case "already_completed" if record is not None:
            return recorded_outcome(tool, record, replayed=True)
        case "key_conflict" if record is not None:
            raise KeyConflictError(
                key=who.key, tool=tool.name, recorded=record.args_digest, given=prepared.digest
            )
        case "held" if record is not None:
            if run_version is not None:
                raise RunSuperseded(key=who.key, tool=tool.name, detail=verdict.detail)
            return await _await_settled(io, tool, record)
        case "stale_driver" | "missing_run_version" | "unknown_run" | "run_finished":
            raise RunSuperseded(key=who.key, tool=tool.name, detail=verdict.detail)
        case "contested" if record is not None:
            raise ToolCallContested(record, tool=tool.name)
        case "quarantined":
            raise RunQuarantined(key=who.key, tool=tool.name, detail=verdict.detail)
        case "tenant_mismatch":
            raise TenantMismatchError(key=who.key, tool=tool.name, tenant_id=who.tenant_id)
    raise RuntimeError(
        f"the reservation of {call_label(tool.name, who.key)} was rejected for a reason a fresh "
        f"reservation cannot have ({verdict.reason}: {verdict.detail}); this is a bug in "
        "toolledger, please report it. Nothing was run."
    )


async def _await_settled(
    io: LedgerAccess, tool: Tool[Any, T], record: CallRecord
) -> ToolOutcome[T]:
    """Wait (up to the verdict timeout) for another holder's call to settle; its answer."""
    give_up = time.monotonic() + io.verdict_timeout
    while True:
        outcome = settled_outcome(tool, record, replayed=True)
        if outcome is not None:
            return outcome
        if time.monotonic() >= give_up:
            raise ToolCallInProgress(
                key=record.key, tool=tool.name, open_until=record.deadline + CLOCK_SKEW_GRACE
            )
        await asyncio.sleep(SETTLE_POLL_S)
        record = await io.read_call(record.key) or record
