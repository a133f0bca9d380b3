"""Resending as the lookup: settling an unknown call whose downstream honours its key.

A Stripe-style API replays the first answer it gave for an idempotency key when the same key
comes again within its retention window. For a tool declared `external(replays_key_for=...)`
(`toolledger.runtime.effects`), resending the call's request with the same key inside that
window therefore *is* a lookup: the downstream either replays what it answered the first time
(the effect happened once, and this is its result) or, if the first request never reached it,
takes the request now for the first time. Either way there is one effect, and the ledger learns
which. Outside that declaration nothing here runs: a resend to a system that does not dedupe is
the double refund the ledger exists to prevent.

The rules, the same for the reconciler (`toolledger.processors.reconciler`) and for a runtime
replaying the key (`toolledger.runtime.replay`):

- **Only inside the window.** The window is measured from the key's first reservation
  (`CallRecord.created_at`), the earliest any request with the key could have left, less the
  clock-skew grace: until then the downstream still remembers the key's first answer, whatever
  the reservation that sent it. Past it the call is an operator's (`ResendWindowPassed` says
  why), because the downstream may have forgotten the key and a resend could act again.
- **Never while the call may still run** (`may_still_run`): a resend does not race the
  runtime that is still waiting for the first answer.
- **The arguments as recorded**: the record's `arguments_json`, restored from its blob if it
  travelled by reference, validated by the tool and checked against the recorded digest.
- **Ledgered as a reconcile attempt with its evidence.** Every resend appends a
  `ReconcileAttempted` whose detail says what was sent and what came back (the lines the tool's
  helper noted in `ToolContext.evidence`, then how it ended). If the answer settles the call, a
  `CallCompleted` or `CallFailed` (source `reconcile`) follows for the version the attempt made.
- **What settles**: a returned value is `completed`; a `ToolFailedError` (the downstream's
  answer for this key was no) is `failed`, except a `RefusedBeforeLookup` (authentication, rate
  limits: the downstream did not look the key up, so it says nothing about the first request);
  anything else (not sent, timed out, reset, 5xx, "still in progress") learns nothing, and the
  reconciler asks again on its schedule.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from toolledger.events.lifecycle import CLOCK_SKEW_GRACE
from toolledger.events.models import ReconcileAttempted
from toolledger.events.payloads import bounded_text
from toolledger.events.records import UNSETTLED, CallRecord, Verdict
from toolledger.port import Envelope
from toolledger.runtime.context import ToolContext
from toolledger.runtime.errors import (
    ToolCallError,
    ToolCallIndeterminate,
    ToolFailedError,
    ToolNotAttemptedError,
    call_label,
    resolve_command,
)
from toolledger.runtime.protocol import CallProtocol
from toolledger.runtime.reconcile import finding_for, settles
from toolledger.runtime.tools import ReconcileOutcome, Tool

log = logging.getLogger("toolledger.reconcile")

#: How many times a resend's attempt is recorded against a record that keeps moving on.
RECORD_TRIES = 3


class RefusedBeforeLookup(ToolFailedError):
    """The downstream refused the request before looking its key up (bad credentials, a rate
    limit): this request had no effect, and its answer is no evidence about an earlier one with
    the same key. A first send raising it is `failed`; a resend raising it learns nothing."""

    code = "refused_before_lookup"


class ResendWindowPassed(ToolCallIndeterminate):
    """An unknown call of a key-replaying tool is past the window in which a resend is a lookup;
    an operator settles it."""

    code = "resend_window_passed"

    def __init__(self, record: CallRecord, *, tool: Tool[Any, Any]) -> None:
        ToolCallError.__init__(self, window_passed(record, tool), key=record.key, tool=tool.name)
        self.record = record


def window_end(record: CallRecord, tool: Tool[Any, Any]) -> datetime:
    """Until when the downstream is sure to replay the key's first answer (our clock)."""
    assert tool.effect.replays_key_for is not None
    return record.created_at + tool.effect.replays_key_for - CLOCK_SKEW_GRACE


def past_window(record: CallRecord, tool: Tool[Any, Any], now: datetime) -> bool:
    """Whether a resend of `record` at `now` may no longer be a lookup."""
    return now >= window_end(record, tool)


def window_passed(record: CallRecord, tool: Tool[Any, Any]) -> str:
    """The sentence for people about a call that is past its resend window."""
    why = record.error or "the process running it stopped before recording an outcome"
    return (
        f"call {call_label(tool.name, record.key)} is {record.status} ({why}), and past the "
        f"{tool.effect.replays_key_for} in which its downstream replays the first answer for a "
        f"repeated key (first reserved {record.created_at.isoformat()}): a resend now could take "
        "effect a second time, so it is not resent. Look idempotency key "
        f"{record.key} up in the other system, then resolve it with {resolve_command(record.key)}."
    )


@dataclass(frozen=True)
class Resent:
    """What one resend found, and the verdict of the last request that recorded it."""

    found: ReconcileOutcome
    verdict: Verdict


async def settle_by_resend(
    protocol: CallProtocol, tool: Tool[Any, Any], record: CallRecord
) -> Resent:
    """Resend `record`'s call with its key, record the attempt and what it settles.

    The caller has checked the window (`past_window`) and that the call may not still run.
    `LedgerUnavailable` escapes when a verdict does not come in time: the resend was harmless,
    and the call is asked about again.
    """
    record = await protocol.port.restored_call(record)
    found = await resend(tool, record, protocol.clock())
    verdict = await _record_attempt(protocol, record, found)
    if not verdict.accepted or verdict.call is None or found.status == "unknown":
        return Resent(found, verdict)
    finding = finding_for(verdict.call, tool, found, protocol.clock())
    if not settles(finding):
        return Resent(found, verdict)  # a "failed" on a call that may still run: asked later
    return Resent(found, await protocol.settle(finding))


async def _record_attempt(
    protocol: CallProtocol, record: CallRecord, found: ReconcileOutcome
) -> Verdict:
    """Append the resend as a reconcile attempt; again for the record's new version while it
    moved on under the same reservation (its runtime's `indeterminate` landed meanwhile)."""
    verdict: Verdict | None = None
    for _ in range(RECORD_TRIES):
        envelope: Envelope = {
            "key": record.key,
            "run_id": record.run_id,
            "tool_call_id": record.tool_call_id,
            "tenant_id": record.tenant_id,
            "occurred_at": protocol.clock(),
        }
        attempt = ReconcileAttempted(
            **envelope,
            reservation_id=record.reservation_id,
            expected_version=record.version,
            attempt=record.reconcile_attempts + 1,
            detail=bounded_text(found.detail),
        )
        verdict = await protocol.settle(attempt)
        now = verdict.call
        if verdict.accepted or now is None or verdict.reason != "version_mismatch":
            return verdict
        if now.reservation_id != record.reservation_id or now.status not in UNSETTLED:
            return verdict
        log.info("resend of %s recorded against version %d", record.key, now.version)
        record = now
    assert verdict is not None
    return verdict


async def resend(tool: Tool[Any, Any], record: CallRecord, now: datetime) -> ReconcileOutcome:
    """Run the tool again with `record`'s arguments and key; what the downstream's answer says.

    `detail` is the evidence: the key, what the tool's helper saw, and how the resend ended.
    """
    try:
        prepared = tool.prepare(json.loads(record.arguments_json))
    except (ValueError, ValidationError) as exc:
        return _unknown(record, [], f"its recorded arguments no longer fit the tool ({exc})")
    if prepared.digest != record.args_digest:
        return _unknown(
            record, [], "its recorded arguments no longer fingerprint to the recorded digest"
        )
    context = ToolContext(
        run_id=record.run_id,
        tool_call_id=record.tool_call_id,
        tenant_id=record.tenant_id,
        attempt=record.reconcile_attempts + 1,
        deadline=now + timedelta(seconds=tool.timeout),
        tool=tool.name,
        idempotency_key=record.key,
    )
    try:
        async with asyncio.timeout(tool.timeout):
            value = await tool.fn(**prepared.values, **{tool.context_param.name: context})
    except RefusedBeforeLookup as exc:
        return _unknown(record, context.evidence, f"refused before the key was looked up: {exc}")
    except ToolFailedError as exc:
        detail = _evidence(record, context.evidence, f"the downstream said no: {exc}")
        return ReconcileOutcome(status="failed", detail=detail)
    except ToolNotAttemptedError as exc:
        return _unknown(record, context.evidence, f"not sent: {exc}")
    except TimeoutError:
        return _unknown(record, context.evidence, f"timed out after {tool.timeout:g}s")
    except Exception as exc:
        return _unknown(record, context.evidence, f"{type(exc).__name__}: {exc}")
    detail = _evidence(record, context.evidence, "the downstream answered; the call completed")
    return ReconcileOutcome(status="completed", value=value, detail=detail)


def _unknown(record: CallRecord, seen: list[str], ending: str) -> ReconcileOutcome:
    return ReconcileOutcome(status="unknown", detail=_evidence(record, seen, ending))


def _evidence(record: CallRecord, seen: list[str], ending: str) -> str:
    lines = "; ".join(seen) or "the tool noted no answer"
    return f"resent with idempotency key {record.key}: {lines}; {ending}"
