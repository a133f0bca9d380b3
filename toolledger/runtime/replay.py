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
  hook it is asked first (`toolledger.runtime.reconcile`, the reconciler's rule): `completed`
  is recorded (source `reconcile`) and its result returned, as if the crash never happened;
  `failed` is recorded only when the decider would accept it (the call is `indeterminate`, or
  `started` past its deadline plus the clock-skew grace); an "unknown" is not recorded; an
  effect found while the record moved on (its runtime's own outcome landed meanwhile) is
  recorded against the new version; otherwise the answer is `ToolCallInProgress` while a
  `started` call may still finish, and `ToolCallIndeterminate` after, naming the command that
  settles it. A tool whose downstream replays its first answer for a repeated key
  (`external(replays_key_for=...)`) is resent instead, with the same key, once the call may no
  longer be running and while the window lasts (`toolledger.runtime.resend`); past the window
  the answer is `ResendWindowPassed`, which says why the call is an operator's.

A reservation the decider rejected is told the truth too (`lost_reservation`): "held" means
another reservation of the key is running, so under run fencing this driver is superseded, and
without fencing it waits (bounded by the verdict timeout) for that call to settle and returns
its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, TypeVar

from toolledger.events.lifecycle import may_still_run, open_until
from toolledger.events.records import CallRecord, Verdict
from toolledger.runtime import resend
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
from toolledger.runtime.protocol import CallProtocol
from toolledger.runtime.reconcile import ask_hook, finding_for, settles
from toolledger.runtime.tools import PreparedCall, Tool

log = logging.getLogger("toolledger.runtime")

T = TypeVar("T")

#: How often a call that lost its reservation re-reads the key while waiting for it to settle.
SETTLE_POLL_S = 0.05
#: How many times an effect a hook found is recorded against a record that keeps moving on.
FINDING_TRIES = 3


async def replay_known(
    protocol: CallProtocol,
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
        return await _reconcile(protocol, tool, who, record)
    return settled_outcome(tool, record, replayed=True)


async def _reconcile(
    protocol: CallProtocol, tool: Tool[Any, T], who: CallIdentity, record: CallRecord
) -> ToolOutcome[T]:
    if tool.reconcile is not None:
        record = await _record_finding(protocol, tool, record)
        outcome = settled_outcome(tool, record, replayed=True)
        if outcome is not None:
            return outcome
    elif tool.resends and not may_still_run(record, protocol.clock()):
        if resend.past_window(record, tool, protocol.clock()):
            raise resend.ResendWindowPassed(record, tool=tool)
        record = (await resend.settle_by_resend(protocol, tool, record)).verdict.call or record
        outcome = settled_outcome(tool, record, replayed=True)
        if outcome is not None:
            return outcome
    if may_still_run(record, protocol.clock()):
        raise ToolCallInProgress(key=who.key, tool=tool.name, open_until=open_until(record))
    raise ToolCallIndeterminate(record, tool=tool.name)


async def _record_finding(
    protocol: CallProtocol, tool: Tool[Any, Any], record: CallRecord
) -> CallRecord:
    """Ask the hook about `record` and record what settles it; the record as it is after.

    A finding is made for the version it was asked about. When the record moved on meanwhile
    under the same reservation (its own runtime's `indeterminate` landed, say), an effect found
    is still found, so it is recorded again against the new version; a "failed" is not: the
    effect may have come after the hook looked.
    """
    found = await ask_hook(tool, record, protocol.clock(), attempt=1)
    for _ in range(FINDING_TRIES):
        finding = finding_for(record, tool, found, protocol.clock())
        if not settles(finding):
            return record
        verdict = await protocol.settle(finding)
        now = verdict.call
        if verdict.accepted or now is None:
            return now or record
        log.info("reconcile finding for %s not applied: %s", record.key, verdict.detail)
        still_holds = found.status == "completed" and verdict.reason == "version_mismatch"
        if not still_holds or now.reservation_id != record.reservation_id:
            return now
        record = now
    return record


async def lost_reservation(
    protocol: CallProtocol,
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
            return await _await_settled(protocol, tool, record)
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
    protocol: CallProtocol, tool: Tool[Any, T], record: CallRecord
) -> ToolOutcome[T]:
    """Wait (up to the verdict timeout) for another holder's call to settle; its answer."""
    give_up = time.monotonic() + protocol.policy.verdict_timeout
    while True:
        outcome = settled_outcome(tool, record, replayed=True)
        if outcome is not None:
            return outcome
        if time.monotonic() >= give_up:
            raise ToolCallInProgress(key=record.key, tool=tool.name, open_until=open_until(record))
        await asyncio.sleep(SETTLE_POLL_S)
        record = await protocol.port.read_call(record.key) or record
