"""One tool call of a framework, through the ledger: what the model hears, or why to pause.

The framework owns the loop, the transcript and the persistence, so an adapter only turns each
call into an `Answer` (text for the model, and the value) or a `Pause` (the framework's own
pause: `interrupt()`, `CallDeferred`, an interruption). What the call comes to is decided by the
runtime's call-policy layer (`toolledger.runtime.policy`), the same rules `AgentRun` follows;
this module words the decision for a model (`toolledger.integrations._common` has the texts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

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
from toolledger.runtime import Heard, HeardStatus, Hold, Ledger, Tool
from toolledger.runtime.pipeline import identity
from toolledger.runtime.policy import drive_call

__all__ = ["Answer", "AnswerStatus", "Pause", "answer_json", "make_call"]

AnswerStatus = HeardStatus


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
    """Make one call, or say why the run must pause (`toolledger.runtime.policy` decides;
    this words it for the model)."""
    who = identity(tool.name, key.run_id, key.tool_call_id, tenant_id)
    decided = await drive_call(ledger.pipeline, tool, who, arguments, options)
    if isinstance(decided, Hold):
        detail = pause_detail(decided.reason, tool.name, key.key, decided.waiting_on)
        return Pause(key.key, tool.name, decided.reason, decided.waiting_on, detail)
    return Answer(
        key.key, tool.name, decided.status, _text(decided), decided.value, decided.same_as
    )


def _text(heard: Heard) -> str:
    """What the model reads about `heard`."""
    tool, key = heard.tool, heard.key
    match heard.told:
        case "same_as":
            return duplicate_text(tool, heard.same_as or key, result_text(heard.result_json))
        case "rejected":
            return rejected_text(tool, heard.detail)
        case "refused":
            return heard.detail or "the call was refused"
        case "compensated":
            return compensated_text(tool, heard.detail)
        case "indeterminate":
            return indeterminate_text(tool, key)
        case "completed":
            return result_text(heard.result_json)
        case "settled_elsewhere":
            return failed_text(tool, key, heard.detail, may_retry=False)
        case "failed":
            return failed_text(tool, key, heard.detail, may_retry=heard.not_attempted)
        case unknown:
            assert_never(unknown)


def answer_json(answer: Answer) -> str:
    """An answer as one JSON object, for frameworks whose tool results are strings."""
    if answer.status == "completed" and answer.same_as is None:
        return answer.text
    return json.dumps({"status": answer.status, "message": answer.text, "key": answer.key})
