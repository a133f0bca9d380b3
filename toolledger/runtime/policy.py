"""The call-policy layer: what a driven call comes to, for `AgentRun` and every framework adapter.

A run driver (`AgentRun`, toolledger/runtime/runs.py) and a framework adapter (LangGraph,
PydanticAI, the OpenAI Agents SDK, MCP: `toolledger.integrations`) ask the same question of
each tool call the model makes: run it, answer it from the ledger, or stop the run here? The
rules live here, once, and each surface only words the answer for its model. In this order:

1. **Read the key once** (read-your-writes: an outcome this process appended and returned on
   acknowledgement counts). The record goes down the call pipeline with the call, never read
   again.
2. **Settled elsewhere**: a call an operator or a reconcile hook settled `failed`, one an
   operator rejected before it ran, or one that was compensated, is answered from its record
   and not reserved again. A contested call (settled failed, then evidence that it took
   effect) is *not* settled: it goes on to the pipeline, which raises `ToolCallContested`, an
   unknown, so the run stops until an operator decides again.
3. **The duplicate-intent guard** (tools that change something; no record of this key yet):
   another call of this run with the same tool and argument digest that is unsettled holds
   this one (`hold`), or lets it run with a warning in the key's history (`allow`). Under
   `hold`, once that call has been settled `completed` by an operator or a reconciler (it was
   unknown when this repeat was made), it answers this one: the retry of a timed-out charge
   hears the charge's result and does not run. The rule needs no memory of the pause, so it
   holds in whichever process resumes, and the model is told it heard a repeat (`same_as`).
4. **The call** (`CallPipeline.call`). Unknown (`ToolCallIndeterminate`, a contested call,
   or another holder still running, `ToolCallInProgress`): stop (`on_indeterminate="pause"`),
   or the model hears it is unknown. Awaiting approval: stop. Bad arguments and key conflicts
   are the model's to hear; every other error (the ledger unreachable, the run superseded or
   quarantined, another tenant's run) is the application's and propagates.

Where the two copies this replaces disagreed, the rules above are the ones kept: read-your-
writes (`AgentRun` read the store directly), the memoryless rule for a twin completed late
(`AgentRun` answered only the call it had itself held), contested calls stop the run (the
adapters answered them "failed"), and reads are never held as duplicate intents.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from toolledger.events.records import UNSETTLED, CallRecord
from toolledger.port import CallQuery
from toolledger.runtime.errors import (
    KeyConflictError,
    ToolArgumentsError,
    ToolCallAwaitingApproval,
    ToolCallIndeterminate,
    ToolCallInProgress,
)
from toolledger.runtime.executor import CallIdentity
from toolledger.runtime.pipeline import CallPipeline
from toolledger.runtime.tools import Tool

__all__ = [
    "Heard",
    "HeardHow",
    "HeardStatus",
    "HeardTold",
    "Hold",
    "HoldReason",
    "OnUnknownOrRepeat",
    "drive_call",
]

HeardStatus = Literal["completed", "failed", "indeterminate", "compensated"]
#: How the answer came about: the tool ran (or the ledger replayed its result), someone else
#: settled the call, an operator rejected it, an earlier call of the same intent answered it,
#: or the call was refused before anything was reserved (bad arguments, a key conflict).
HeardHow = Literal["called", "settled_elsewhere", "rejected", "same_as", "refused"]
HoldReason = Literal["awaiting_reconciliation", "awaiting_approval", "duplicate_intent"]
#: What the model is told, which each surface words its own way (`Heard.told`): a repeat
#: answered by an earlier call, a call compensated, rejected or settled failed by someone else,
#: refused before it was reserved, or the call's own end.
HeardTold = Literal[
    "same_as",
    "compensated",
    "rejected",
    "settled_elsewhere",
    "refused",
    "completed",
    "indeterminate",
    "failed",
]
#: Who settles a call after it was unknown (its runtime never heard how it ended).
_LATE_SETTLERS = ("operator", "reconcile")
#: How many calls of a run with one tool the twin lookup reads.
TWIN_SCAN_LIMIT = 500


class OnUnknownOrRepeat(Protocol):
    """What to do with an unknown call and with a repeated intent (`ToolPolicy` and the
    adapters' `AdapterOptions` both are one)."""

    @property
    def on_indeterminate(self) -> Literal["fail", "pause"]: ...

    @property
    def duplicate_intent(self) -> Literal["hold", "allow"]: ...


@dataclass(frozen=True)
class Heard:
    """What the model hears about the call, before a surface words it."""

    key: str
    tool: str
    status: HeardStatus
    how: HeardHow
    #: A completed call's result as stored (JSON), and as the tool's declared type.
    result_json: str | None = None
    value: Any = None
    #: The error or the reason, for a call that did not complete.
    detail: str | None = None
    #: A failed call that did not run: calling it again is safe.
    not_attempted: bool = False
    #: For `how == "same_as"`: the key of the earlier call whose answer this is.
    same_as: str | None = None

    @property
    def told(self) -> HeardTold:
        """Which answer the model hears: a compensation whoever settled it, else how the call
        was answered, and for a call made, how it ended."""
        if self.status == "compensated":
            return "compensated"
        match self.how:
            case "called":
                return self.status
            case "same_as" | "rejected" | "settled_elsewhere" | "refused":
                return self.how


@dataclass(frozen=True)
class Hold:
    """The run must stop at this call until `waiting_on` is settled (or decided)."""

    key: str
    tool: str
    reason: HoldReason
    waiting_on: str
    #: The error that says why, for people and logs.
    detail: str


async def drive_call(
    pipeline: CallPipeline,
    tool: Tool[Any, Any],
    who: CallIdentity,
    arguments: Mapping[str, Any],
    policy: OnUnknownOrRepeat,
    *,
    run_version: int | None = None,
) -> Heard | Hold:
    """Make one call under `policy`, or say why the run must stop (the module docstring)."""
    record = await pipeline.read(who.key)
    told = settled_elsewhere(tool, record)
    if told is not None:
        return told
    warning = None
    if record is None and tool.effect.changes_something:
        twin = await _twin(pipeline, tool, who, arguments)
        if twin is not None and twin.status in UNSETTLED:
            if policy.duplicate_intent == "hold":
                detail = f"{who.key} repeats {twin.key} ({twin.status}); held until it is settled"
                return Hold(who.key, tool.name, "duplicate_intent", twin.key, detail)
            warning = f"duplicate intent of {twin.key} ({twin.status}), allowed by policy"
        elif twin is not None and policy.duplicate_intent == "hold":
            twin = await pipeline.port.restored_call(twin)
            result = twin.result_json if twin.result_json is not None else "null"
            value = tool.load_result(result)
            return Heard(
                who.key, tool.name, "completed", "same_as", result, value, same_as=twin.key
            )
    try:
        outcome = await pipeline.call(
            tool, who, arguments, run_version=run_version, warning=warning, record=record
        )
    except (ToolCallIndeterminate, ToolCallInProgress) as exc:  # contested included
        if policy.on_indeterminate == "pause":
            return Hold(who.key, tool.name, "awaiting_reconciliation", who.key, str(exc))
        return Heard(who.key, tool.name, "indeterminate", "called", detail=str(exc))
    except ToolCallAwaitingApproval as exc:
        return Hold(who.key, tool.name, "awaiting_approval", who.key, str(exc))
    except (KeyConflictError, ToolArgumentsError) as exc:  # ToolArgumentsTooLarge included
        return Heard(who.key, tool.name, "failed", "refused", detail=str(exc))
    if outcome.status == "completed":
        stored = outcome.record.result_json if outcome.record is not None else None
        result = stored if stored is not None else tool.dump_result(outcome.value)
        return Heard(who.key, tool.name, "completed", "called", result, outcome.value)
    return Heard(
        who.key,
        tool.name,
        "failed",
        "called",
        detail=outcome.error,
        not_attempted=outcome.not_attempted,
    )


def settled_elsewhere(tool: Tool[Any, Any], record: CallRecord | None) -> Heard | None:
    """The answer for a call settled by someone other than a run of it; None: make the call."""
    if record is None:
        return None
    if record.status in ("compensating", "compensated"):
        return Heard(
            record.key, tool.name, "compensated", "settled_elsewhere", detail=record.reason
        )
    if record.status != "failed" or record.contested:
        return None  # a contested call raises ToolCallContested in the pipeline: an unknown
    why = record.reason or record.error or "no reason given"
    if record.settled_by == "operator" and record.not_attempted:
        return Heard(record.key, tool.name, "failed", "rejected", detail=why, not_attempted=True)
    if record.settled_by in ("operator", "reconcile"):
        return Heard(record.key, tool.name, "failed", "settled_elsewhere", detail=why)
    return None


async def _twin(
    pipeline: CallPipeline, tool: Tool[Any, Any], who: CallIdentity, arguments: Mapping[str, Any]
) -> CallRecord | None:
    """Another call of this run, same tool and argument digest, unsettled or settled after
    being unknown (completed by an operator or reconciler); None if there is none."""
    query = CallQuery(
        tenant_id=who.tenant_id, run_id=who.run_id, tool=tool.name, limit=TWIN_SCAN_LIMIT
    )
    others = [c for c in await pipeline.port.list_calls(query) if c.key != who.key]
    if not others:
        return None  # the common case: no digest needed (validating costs more than listing)
    try:
        digest = tool.prepare(arguments).digest
    except ValueError:
        return None  # the pipeline reports the bad arguments
    twins = [c for c in others if c.args_digest == digest]
    unsettled = [c for c in twins if c.status in UNSETTLED]
    if unsettled:
        return unsettled[0]
    late = [
        c for c in twins if c.status == "completed" and c.settled_by in ("operator", "reconcile")
    ]
    return late[0] if late else None
