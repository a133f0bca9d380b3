"""What every framework adapter shares, and no framework: names, keys, texts, options.

- **Model-facing tool names.** OpenAI and Anthropic accept tool names matching
  `^[a-zA-Z0-9_-]{1,64}$`, so `billing.issue_credit` cannot be shown to the model as it is.
  `ToolNames` maps each tool of a toolset to a safe name (`billing__issue_credit`) and back.
  The mapping is a pure function of the set of names, never of declaration order: the names
  end up in persisted histories (a LangGraph checkpoint, a PydanticAI message history, a
  `RunState`), so a process that resumes one must compute the same names. Names that would
  collide, or are longer than 64 characters, get a suffix from the SHA-256 of the full name.
- **Call keys.** The key is `<run_id>:<tool_call_id>` (docs/architecture.md, guarantee 1), and
  the ledger splits it at the first `:`. Framework run ids often contain colons (a thread id
  `user:42`), so `encode_run_id` percent-encodes `%` and `:`: reversible, collision-free, and a
  key never splits anywhere but between run id and call id. An empty id is refused, naming
  where the framework takes it from.
- **What the model hears.** A completed call's result; a failed call's "did not take effect",
  and whether it may be called again; an unknown call's "unknown, do not call it again", with
  the key an operator settles. Never the framework's "Please try again".
- **Adapter options** (`AdapterOptions`): `duplicate_intent` and `on_indeterminate`, with the
  meaning they have for `AgentRun` (toolledger/runtime/agents.py, `ToolPolicy`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from toolledger.runtime import Tool, ToolPolicy, call_label, resolve_command

__all__ = [
    "SAFE_NAME",
    "AdapterOptions",
    "CallKey",
    "PauseReason",
    "ToolNames",
    "call_key_for",
    "compensated_text",
    "decode_run_id",
    "duplicate_text",
    "encode_run_id",
    "failed_text",
    "indeterminate_text",
    "model_tool_name",
    "pause_detail",
    "rejected_text",
    "result_text",
]


#: What OpenAI's and Anthropic's APIs accept as a function name.
SAFE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MAX_NAME = 64
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def _suffixed(base: str, full_name: str) -> str:
    digest = hashlib.sha256(full_name.encode()).hexdigest()[:8]
    return f"{base[: _MAX_NAME - 9]}-{digest}"


def model_tool_name(tool_name: str) -> str:
    """The readable safe name of one tool: `.` becomes `__`, other unsafe characters `_`.

    Alone it can collide (`a.b_c` and `a_.b_c`...); `ToolNames` resolves collisions.
    """
    base = _UNSAFE.sub("_", tool_name.replace(".", "__"))
    return base if len(base) <= _MAX_NAME else _suffixed(base, tool_name)


class ToolNames:
    """Model-facing names for a set of tools, and the tool behind each name."""

    def __init__(self, tools: Iterable[Tool[Any, Any]]) -> None:
        self._tools: dict[str, Tool[Any, Any]] = {}
        by_base: dict[str, list[str]] = {}
        declared: dict[str, Tool[Any, Any]] = {}
        for tool in tools:
            if tool.name in declared:
                raise ValueError(f"tool {tool.name} is given twice")
            declared[tool.name] = tool
            by_base.setdefault(model_tool_name(tool.name), []).append(tool.name)
        self._names: dict[str, str] = {}
        for base, full_names in by_base.items():
            for full_name in full_names:
                safe = base if len(full_names) == 1 else _suffixed(base, full_name)
                self._names[full_name] = safe
        if len(set(self._names.values())) != len(self._names):  # a suffix hit a base: rare
            raise ValueError(
                "two tools map to one model-facing name even with a hash suffix: "
                + ", ".join(sorted(self._names))
                + "; rename one of them"
            )
        self._tools = {self._names[name]: tool for name, tool in declared.items()}

    def model_name(self, tool_name: str) -> str:
        """The name the model sees for the tool `tool_name` (`KeyError` if not in the set)."""
        return self._names[tool_name]

    def tool(self, model_name: str) -> Tool[Any, Any] | None:
        """The tool behind a model-facing name (None: not one of these tools)."""
        return self._tools.get(model_name)

    def items(self) -> Iterable[tuple[str, Tool[Any, Any]]]:
        """(model-facing name, tool) pairs, in declaration order."""
        return self._tools.items()


# -- keys ---------------------------------------------------------------------------------------


def encode_run_id(framework_id: str) -> str:
    """A framework's run id (thread id, conversation id) as a ledger run id without `:`."""
    return framework_id.replace("%", "%25").replace(":", "%3A")


def decode_run_id(run_id: str) -> str:
    """The framework id `encode_run_id` was given."""
    return run_id.replace("%3A", ":").replace("%25", "%")


@dataclass(frozen=True)
class CallKey:
    """A call's identity in the ledger, from the framework's ids."""

    run_id: str
    tool_call_id: str

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.tool_call_id}"


def call_key_for(framework_run_id: str | None, tool_call_id: str | None, *, source: str) -> CallKey:
    """The key for a framework's run id and call id; `ValueError` naming `source` if missing.

    `source` says where the run id comes from (`config["configurable"]["thread_id"]`), so the
    error tells the developer what to set.
    """
    if not isinstance(framework_run_id, str) or not framework_run_id:
        raise ValueError(
            f"toolledger needs a run id that survives a resume, from {source}; none was given "
            f"(got {framework_run_id!r}). Set it: without it no call can have a stable key."
        )
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise ValueError(
            f"the framework gave no tool call id (got {tool_call_id!r}) in run "
            f"{framework_run_id!r}; toolledger cannot key the call"
        )
    if "\x00" in framework_run_id or "\x00" in tool_call_id:
        raise ValueError(f"ids must not contain NUL (run {framework_run_id!r})")
    return CallKey(encode_run_id(framework_run_id), tool_call_id)


# -- what the model hears -----------------------------------------------------------------------


def failed_text(tool: str, key: str, error: str | None, *, may_retry: bool) -> str:
    """A failed call: it did not take effect, and whether calling it again is safe."""
    then = (
        "Nothing was sent, so it may be called again."
        if may_retry
        else "Do not call it again with the same arguments unless the cause has been fixed."
    )
    cause = (error or "no reason recorded").rstrip().rstrip(".")  # its period: ours follows
    return f"{tool} did not take effect: {cause}. {then}"


def indeterminate_text(tool: str, key: str) -> str:
    """An unknown call: nobody knows whether it took effect; it must not be repeated."""
    return (
        f"The outcome of {tool} is unknown: it may or may not have taken effect. Do not call it "
        f"again, not even with new arguments for the same purpose. An operator is settling it "
        f"under idempotency key {key}; tell the user it is being checked."
    )


def compensated_text(tool: str, reason: str | None) -> str:
    return (
        f"{tool} took effect and was then undone (compensated) by an operator"
        f" ({reason or 'no reason given'})."
    )


def rejected_text(tool: str, reason: str | None) -> str:
    return (
        f"An operator rejected {tool}; it did not run ({reason or 'no reason given'}). "
        "Do not call it again for the same purpose."
    )


def duplicate_text(tool: str, twin_key: str, result_json: str) -> str:
    """The answer to a repeat of a call that completed: the first call's result, not a rerun."""
    return (
        f"This repeats the call {twin_key}, which completed; {tool} was not run again. "
        f"Its result: {result_json}"
    )


def pause_detail(reason: str, tool: str, key: str, waiting_on: str) -> str:
    """For people and logs: why a run paused at this call, and what settles it."""
    label = call_label(tool, key)
    if reason == "awaiting_approval":
        return (
            f"call {label} needs an operator's approval: `toolledger executions approve {key} "
            "--reason ...` (or reject), then resume the run"
        )
    if reason == "duplicate_intent":
        return (
            f"call {label} repeats the unsettled call {waiting_on} (same tool and arguments); "
            f"it is held until that call is settled: {resolve_command(waiting_on)}"
        )
    return f"call {label} is unknown; settle it with {resolve_command(key)}, then resume the run"


def result_text(result_json: str | None) -> str:
    """A completed call's result as the model reads it: its stored JSON."""
    return result_json if result_json is not None else json.dumps(None)


# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterOptions:
    """What an adapter does with an unknown call and with a repeated intent.

    `on_indeterminate`: `pause` (the default here): the run stops in the framework's own pause
    and resumes, once the call is settled, with the truth. `fail`: the model hears that the
    outcome is unknown and must not be repeated (never "please try again"), and the run goes on.
    `duplicate_intent`: `hold` (default): a new call repeating the tool and arguments of an
    unsettled call of the same run pauses until that call is settled, and then hears its
    result instead of running again if it completed. `allow`: it runs, with a warning kept in
    the key's history. Both mean what they mean for `AgentRun` (`ToolPolicy`); the one
    difference is this default for `on_indeterminate`, because every framework here has a
    pause, which is what an unknown call deserves.
    """

    on_indeterminate: Literal["fail", "pause"] = "pause"
    duplicate_intent: Literal["hold", "allow"] = "hold"

    @classmethod
    def from_policy(cls, policy: ToolPolicy) -> AdapterOptions:
        """The options of an agent's `tool_policy` (its `on_error` is the framework's job)."""
        return cls(
            on_indeterminate=policy.on_indeterminate, duplicate_intent=policy.duplicate_intent
        )


PauseReason = Literal["awaiting_reconciliation", "awaiting_approval", "duplicate_intent"]
