"""What a reconcile hook's answer becomes: asking the hook, and the request that records it.

One rule for both places a hook is asked: a runtime replaying a key nobody knows the outcome of
(`toolledger.runtime.replay`) and the reconcile driver (`toolledger.processors.reconciler`).
Apart from calling the hook it is pure. A finding always names the reservation and the record
version it was asked about (`expected_version`), which is what lets the decider reject it when
the call moved on meanwhile: an operator resolved it, its runtime reserved it again, or another
reconciler got there first.

- `completed`: `CallCompleted(source="reconcile")` with the hook's value stored through the
  tool's own result serializer (so a replay restores the declared type) and its
  `result_reference`.
- `failed`: `CallFailed(source="reconcile")`, but on a call that may still be running
  (`toolledger.events.lifecycle.may_still_run`) only an attempt, because its runtime may still
  be finishing it; the decider would reject the `failed`.
- `unknown`, a hook that raised, overran the tool's timeout or returned something else:
  `ReconcileAttempted`, numbered, which the decider counts and the schedule backs off on. Only
  the reconciler records those (`settles` tells them apart): a runtime that learns nothing
  answers its caller and leaves the counting to the reconciler's schedule.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any, TypeGuard, assert_never

from toolledger.events.lifecycle import may_still_run, open_until
from toolledger.events.models import CallCompleted, CallFailed, ReconcileAttempted
from toolledger.events.payloads import bounded_text
from toolledger.events.records import CallRecord
from toolledger.port import Envelope
from toolledger.runtime.context import ToolContext
from toolledger.runtime.tools import ReconcileOutcome, Tool

log = logging.getLogger("toolledger.reconcile")

Finding = CallCompleted | CallFailed | ReconcileAttempted


def finding_for(
    record: CallRecord, tool: Tool[Any, Any], found: ReconcileOutcome, now: datetime
) -> Finding:
    """The request that records what the hook found about `record`, at `now`."""
    envelope: Envelope = {
        "key": record.key,
        "run_id": record.run_id,
        "tool_call_id": record.tool_call_id,
        "tenant_id": record.tenant_id,
        "occurred_at": now,
    }
    detail = bounded_text(found.detail)  # for people; a hook's essay must not stall the finding
    match found.status:
        case "completed":
            return CallCompleted(
                **envelope,
                reservation_id=record.reservation_id,
                result_json=tool.dump_result(found.value),
                result_reference=found.result_reference,
                source="reconcile",
                expected_version=record.version,
            )
        case "failed":
            if not may_still_run(record, now):
                return CallFailed(
                    **envelope,
                    reservation_id=record.reservation_id,
                    error=detail or "the reconcile hook found no effect",
                    source="reconcile",
                    expected_version=record.version,
                )
            detail = (
                f"the hook found no effect, but the call may still be running until "
                f"{open_until(record).isoformat()}; asked again later. {detail}"
            ).strip()
        case "unknown":
            pass
        case _:
            assert_never(found.status)
    return ReconcileAttempted(
        **envelope,
        reservation_id=record.reservation_id,
        expected_version=record.version,
        attempt=record.reconcile_attempts + 1,
        detail=detail,
    )


def settles(finding: Finding) -> TypeGuard[CallCompleted | CallFailed]:
    """Whether `finding` settles the call (rather than only counting an attempt)."""
    return not isinstance(finding, ReconcileAttempted)


async def ask_hook(
    tool: Tool[Any, Any], record: CallRecord, now: datetime, *, attempt: int | None = None
) -> ReconcileOutcome:
    """The hook's answer; a hook that raises, overruns the tool's timeout or returns something
    else than a `ReconcileOutcome` knows nothing.

    `attempt` is the context's attempt number: by default the reconciler's count of questions
    (`reconcile_attempts + 1`); a runtime replaying the key asks as its own first attempt.
    """
    assert tool.reconcile is not None
    context = ToolContext(
        run_id=record.run_id,
        tool_call_id=record.tool_call_id,
        tenant_id=record.tenant_id,
        attempt=record.reconcile_attempts + 1 if attempt is None else attempt,
        deadline=now + timedelta(seconds=tool.timeout),
        tool=tool.name,
        idempotency_key=record.key,
    )
    try:
        async with asyncio.timeout(tool.timeout):
            found = await tool.reconcile(record, context)
    except Exception as exc:
        log.warning("reconcile hook of %s failed for %s: %r", tool.name, record.key, exc)
        return ReconcileOutcome(status="unknown", detail=f"the hook failed: {exc!r}")
    if not isinstance(found, ReconcileOutcome):
        log.warning("reconcile hook of %s returned %r, not a ReconcileOutcome", tool.name, found)
        return ReconcileOutcome(
            status="unknown", detail=f"the hook returned {type(found).__name__}, not an outcome"
        )
    return found
