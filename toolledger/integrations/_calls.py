"""One tool call of a framework, through the ledger: what the model hears, or why to pause.

`make_call` is what `AgentRun._make` does for one call (toolledger/runtime/runs.py), without
the run: the framework owns the loop, the transcript and the persistence, so the adapter only
turns each call into an `Answer` (text for the model, and the value) or a `Pause` (the
framework's own pause: `interrupt()`, `CallDeferred`, an interruption), in this order:

1. A call an operator or a reconcile hook settled failed, or that was compensated, is answered
   from its record: it is not reserved again (a rejected approval stays rejected).
2. The duplicate-intent guard (non-read tools, no record of this key yet): another call of this
   run with the same tool and argument digest that is unsettled holds this one (`hold`), or
   lets it run with a warning in the history (`allow`). Once that call is settled it answers
   this one if it completed after having been unknown (settled by an operator or reconciler):
   the repeat of a timed-out charge hears the charge's result and does not run. This rule
   needs no memory of the pause, so it holds in whichever process resumes.
3. `Ledger.call`. Unknown (`ToolCallIndeterminate`, or another holder still running,
   `ToolCallInProgress`): pause, or with `on_indeterminate="fail"` the model hears it is
   unknown. Awaiting approval: pause. Bad arguments and key conflicts are answered to the
   model; errors that are not the model's to handle (the ledger unreachable, the run
   superseded or quarantined, another tenant's run) propagate to the application.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolledger.events.records import UNSETTLED, CallRecord
from toolledger.integrations._common import (
    AdapterOptions,
    CallKey,
    PauseReason,
    compensated_text,
    duplicate_text,
    failed_text,
    indeterminate_text,
    pause_detail,
    rejected_text,
    result_text,
)
from toolledger.runtime.errors import (
    KeyConflictError,
    ToolArgumentsError,
    ToolCallAwaitingApproval,
    ToolCallIndeterminate,
    ToolCallInProgress,
)
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.port import CallQuery
from toolledger.runtime.tools import Tool

AnswerStatus = Literal["completed", "failed", "indeterminate", "compensated"]


@dataclass(frozen=True)
class Answer:
    """What the model hears about a call: `text`, and for a completed call its `value`."""

    key: str
    tool: str
    status: AnswerStatus
    text: str
    value: Any = None
    #: For a repeat answered by an earlier call: that call's key.
    same_as: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True)
class Pause:
    """The run must stop here until `waiting_on` is settled (or decided, for an approval)."""

    key: str
    tool: str
    reason: PauseReason
    waiting_on: str
    detail: str = field(default="")

    def payload(self) -> dict[str, str]:
        """JSON-ready, for the framework's pause (an interrupt value, deferral metadata)."""
        return {
            "toolledger": self.reason,
            "key": self.key,
            "tool": self.tool,
            "waiting_on": self.waiting_on,
            "detail": self.detail,
        }


async def make_call(
    ledger: Ledger,
    tool: Tool[Any, Any],
    key: CallKey,
    *,
    tenant_id: str,
    arguments: Mapping[str, Any],
    options: AdapterOptions,
) -> Answer | Pause:
    """Make one call, or say why the run must pause; see the module docstring for the rules."""
    record = await ledger.read_call(key.key)
    told = _settled_elsewhere(tool, record)
    if told is not None:
        return told
    warning = None
    if record is None and tool.effect.changes_something:
        twin = await _twin(ledger, tool, key, tenant_id, arguments)
        if twin is not None and twin.status in UNSETTLED:
            if options.duplicate_intent == "hold":
                return _pause(tool, key, "duplicate_intent", twin.key)
            warning = f"duplicate intent of {twin.key} ({twin.status}), allowed by policy"
        elif twin is not None and options.duplicate_intent == "hold":
            text = result_text(twin.result_json)
            value = tool.load_result(text)
            return Answer(
                key.key,
                tool.name,
                "completed",
                duplicate_text(tool.name, twin.key, text),
                value,
                twin.key,
            )
    try:
        outcome = await ledger.call(
            tool,
            run_id=key.run_id,
            tool_call_id=key.tool_call_id,
            tenant_id=tenant_id,
            arguments=arguments,
            warning=warning,
        )
    except (ToolCallIndeterminate, ToolCallInProgress):
        if options.on_indeterminate == "pause":
            return _pause(tool, key, "awaiting_reconciliation", key.key)
        return Answer(key.key, tool.name, "indeterminate", indeterminate_text(tool.name, key.key))
    except ToolCallAwaitingApproval:
        return _pause(tool, key, "awaiting_approval", key.key)
    except (KeyConflictError, ToolArgumentsError) as exc:
        return Answer(key.key, tool.name, "failed", str(exc))
    if outcome.status == "completed":
        stored = outcome.record.result_json if outcome.record is not None else None
        text = stored if stored is not None else tool.dump_result(outcome.value)
        return Answer(key.key, tool.name, "completed", text, outcome.value)
    return Answer(
        key.key,
        tool.name,
        "failed",
        failed_text(tool.name, key.key, outcome.error, may_retry=outcome.not_attempted),
    )


def _pause(tool: Tool[Any, Any], key: CallKey, reason: PauseReason, waiting_on: str) -> Pause:
    return Pause(
        key.key, tool.name, reason, waiting_on, pause_detail(reason, tool.name, key.key, waiting_on)
    )


def _settled_elsewhere(tool: Tool[Any, Any], record: CallRecord | None) -> Answer | None:
    """The answer for a call settled by someone other than a run of it; None: make the call."""
    if record is None:
        return None
    if record.status in ("compensating", "compensated"):
        text = compensated_text(tool.name, record.reason)
        return Answer(record.key, tool.name, "compensated", text)
    rejected = record.settled_by == "operator" and record.not_attempted
    if record.status == "failed" and rejected:
        return Answer(record.key, tool.name, "failed", rejected_text(tool.name, record.reason))
    if record.status == "failed" and record.settled_by in ("operator", "reconcile"):
        why = record.reason or record.error or "no reason given"
        text = failed_text(tool.name, record.key, why, may_retry=False)
        return Answer(record.key, tool.name, "failed", text)
    return None


async def _twin(
    ledger: Ledger,
    tool: Tool[Any, Any],
    key: CallKey,
    tenant_id: str,
    arguments: Mapping[str, Any],
) -> CallRecord | None:
    """Another call of this run, same tool and argument digest, unsettled or settled after
    being unknown (completed by an operator or reconciler); None if there is none."""
    calls = await ledger.port.list_calls(
        CallQuery(tenant_id=tenant_id, run_id=key.run_id, tool=tool.name, limit=500)
    )
    others = [c for c in calls if c.tool_call_id != key.tool_call_id]
    if not others:
        return None  # the common case: no digest needed (validating costs more than listing)
    try:
        digest = tool.prepare(arguments).digest
    except ValueError:
        return None  # Ledger.call reports the bad arguments
    twins = [c for c in others if c.args_digest == digest]
    unsettled = [c for c in twins if c.status in UNSETTLED]
    if unsettled:
        return unsettled[0]
    settled_late = [
        c for c in twins if c.status == "completed" and c.settled_by in ("operator", "reconcile")
    ]
    return settled_late[0] if settled_late else None


def answer_json(answer: Answer) -> str:
    """An answer as one JSON object, for frameworks whose tool results are strings."""
    if answer.status == "completed" and answer.same_as is None:
        return answer.text
    return json.dumps({"status": answer.status, "message": answer.text, "key": answer.key})
