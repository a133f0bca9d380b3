"""OpenAI Agents SDK: `FunctionTool`s whose calls go through the ledger, once per call key.

    tools = OpenAIAgentsTools(ledger, billing, tenant_id="acme")
    agent = Agent(name="refunds", tools=tools.tools, model=...)
    result = await Runner.run(agent, "refund order 7", context={"run_id": "order-7"})
    if (paused := tools.paused(result)) is not None:   # unknown, held, or awaiting approval
        save(paused.state_json)                         # the SDK's own RunState JSON
        ...  # an operator settles the call over the API; later, in any process:
        state = await tools.resume(agent, saved_json)
        result = await Runner.run(agent, state)

- **The key** is `<run id>:<call_id>`. The run id is the application's (`context["run_id"]`,
  or `context.run_id`, or `run_id_of=`): the SDK has no id of its own that survives a new
  process. The call id comes from the model's response, so the key is stable only if that
  response was persisted before the tool ran: a plain restart asks the model again and gets
  new call ids, unless the run resumes from a saved `RunState` (an interruption's JSON) or
  runs inside Temporal, DBOS or Restate. A `:` in the run id is percent-encoded.
- **Unknown is an interruption, not "An error occurred while running the tool. Please try
  again."**: the SDK decides whether a call pauses in `needs_approval`, before it commits to
  an output, and that is the one place a tool call can stop the run with a resumable
  `RunState`. So the ledger call is made there: a settled answer is kept for `on_invoke_tool`
  to return (the call runs once, right then), and an unknown call, a call held by the
  duplicate-intent guard, or one awaiting an operator's approval returns `True`: the run stops
  with an interruption and the model hears nothing. One consequence: the SDK's tool input
  guardrails and `timeout_seconds` apply after the call was made, not before.
- **Resuming** (`resume`): each of our interruptions is asked of the ledger again. Settled (an
  operator resolved it, the reconciler found it, an approval was decided): the SDK's approval
  is granted and `on_invoke_tool` returns the ledger's truth (`state.reject` with the
  operator's reason for a rejected approval). Still unsettled: left pending, and the run
  stops at it again; `paused()` then reports the ledger's reason (`awaiting_approval` with
  approve/reject, or `awaiting_reconciliation` with resolve), as it was when `resume` asked.
- **The run's record**: each interruption of ours is recorded as the run's pause
  (`run_paused`, `waiting_on` the call) and the answer after it as its resume
  (toolledger/runtime/framework_runs.py), so the console shows the run paused and `toolledger
  resumer` calls its hook when the call is settled; the hook loads the saved `RunState` JSON,
  `resume()`s it and runs it (docs/integrations/openai_agents.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from toolledger.integrations._calls import Answer, Pause, answer_json, make_call
from toolledger.integrations._common import (
    AdapterOptions,
    CallKey,
    ToolNames,
    call_key_for,
    encode_run_id,
    pause_detail,
    rejected_text,
)
from toolledger.integrations._runs import RunPauses
from toolledger.runtime import CallRecord, Ledger, Tool

__all__ = ["RUN_ID_SOURCE", "OpenAIAgentsTools", "PausedRun"]


try:
    from agents import Agent, FunctionTool, RunContextWrapper, RunResult, RunState
    from agents import Tool as AgentTool
    from agents.items import ToolApprovalItem
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "toolledger.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'toolledger[openai-agents]'"
    ) from exc

RUN_ID_SOURCE = 'the run context\'s "run_id" (Runner.run(..., context={"run_id": ...}))'


def _run_id_in(context: Any) -> str | None:
    if isinstance(context, Mapping):
        value = context.get("run_id")
    else:
        value = getattr(context, "run_id", None)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class PausedRun:
    """A run stopped at calls the ledger cannot answer yet, and the state to resume it from."""

    pauses: list[Pause]
    state_json: str

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.pauses]


class OpenAIAgentsTools:
    """A toolset's tools as `FunctionTool`s for an OpenAI agent; calls go through the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        tools: Iterable[Tool[Any, Any]],
        *,
        tenant_id: str,
        options: AdapterOptions | None = None,
        run_id_of: Callable[[Any], str | None] = _run_id_in,
    ) -> None:
        self.ledger = ledger
        self.tenant_id = tenant_id
        self.options = options or AdapterOptions()
        self.names = ToolNames(tools)
        self.run_id_of = run_id_of
        self.runs = RunPauses(ledger, tenant_id)
        self._answers: dict[str, Answer] = {}
        self._pauses: dict[str, Pause] = {}
        self.tools: list[AgentTool] = [
            self._function_tool(name, tool) for name, tool in self.names.items()
        ]

    def _function_tool(self, name: str, tool: Tool[Any, Any]) -> FunctionTool:
        async def needs_approval(
            ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
        ) -> bool:
            made = await self._make(tool, self._key(ctx.context, call_id), params)
            if isinstance(made, Answer):
                self._answers[made.key] = made
                return False
            self._pauses[made.key] = made
            await self.runs.paused(made)
            return True

        async def on_invoke(ctx: ToolContext[Any], arguments: str) -> str:
            key = self._key(ctx.context, ctx.tool_call_id)
            made: Answer | Pause | None = self._answers.pop(key.key, None)
            if made is None:  # approved on resume: ask the ledger now
                made = await self._make(tool, key, json.loads(arguments or "{}"))
            if isinstance(made, Pause):
                raise RuntimeError(
                    f"{made.detail}. The SDK approved call {key.key} but the ledger has no "
                    "decision: resume with OpenAIAgentsTools.resume(), which approves only "
                    "what the ledger settled"
                )
            await self.runs.going_on(key.run_id)
            return answer_json(made)

        return FunctionTool(
            name=name,
            description=(tool.__doc__ or tool.name).strip(),
            params_json_schema=tool.arguments_schema,
            on_invoke_tool=on_invoke,
            strict_json_schema=False,
            needs_approval=needs_approval,
        )

    def _key(self, context: Any, call_id: str) -> CallKey:
        return call_key_for(self.run_id_of(context), call_id, source=RUN_ID_SOURCE)

    async def _make(
        self, tool: Tool[Any, Any], key: CallKey, arguments: Mapping[str, Any]
    ) -> Answer | Pause:
        return await make_call(
            self.ledger,
            tool,
            key,
            tenant_id=self.tenant_id,
            arguments=arguments,
            options=self.options,
        )

    # -- pausing and resuming ---------------------------------------------------------------

    def paused(self, result: RunResult) -> PausedRun | None:
        """The calls of ours this run stopped at, and its state JSON; None if it did not."""
        context = result.context_wrapper.context
        pauses = []
        for item in result.interruptions:
            tool = self.names.tool(item.tool_name or "")
            if tool is not None:
                key = self._key(context, _call_id(item))
                known = self._pauses.pop(key.key, None)
                pauses.append(known if known is not None else _unknown_pause(tool, key))
        if not pauses:
            return None
        return PausedRun(pauses, result.to_state().to_string())

    async def resume(self, agent: Agent[Any], state_json: str) -> RunState[Any, Agent[Any]]:
        """The saved state with each of our settled interruptions answered from the ledger."""
        state = await RunState.from_string(agent, state_json)
        context = state._context.context if state._context is not None else None
        for item in state.get_interruptions():
            tool = self.names.tool(item.tool_name or "")
            if tool is None:
                continue
            key = self._key(context, _call_id(item))
            try:
                arguments = json.loads(getattr(item.raw_item, "arguments", "") or "{}")
            except json.JSONDecodeError:
                state.reject(item, rejection_message="the arguments were not valid JSON")
                continue
            made = await self._make(tool, key, arguments)
            if isinstance(made, Pause):
                # The SDK stops at this interruption again without asking `needs_approval`, so
                # `paused()` must learn why from here (an approval nobody decided is not an
                # unknown call: `resolve` would be refused).
                self._pauses[made.key] = made
                await self.runs.paused(made)
                continue
            record = await self.ledger.read_call(key.key)
            if record is not None and _rejected(record):
                state.reject(item, rejection_message=rejected_text(tool.name, record.reason))
                continue
            self._answers[made.key] = made
            state.approve(item)
        run_id = self.run_id_of(context)
        if run_id:  # a rejection is answered by the SDK, never by on_invoke_tool
            await self.runs.going_on(encode_run_id(run_id))
        return state


def _rejected(record: CallRecord) -> bool:
    """An approval an operator refused (the decider records it failed, not attempted)."""
    return (
        record.requires_approval
        and record.status == "failed"
        and record.settled_by == "operator"
        and record.not_attempted
    )


def _call_id(item: ToolApprovalItem) -> str:
    return str(getattr(item.raw_item, "call_id", "") or "")


def _unknown_pause(tool: Tool[Any, Any], key: CallKey) -> Pause:
    """A pause found in a result this object did not run (another instance made the call)."""
    return Pause(
        key.key,
        tool.name,
        "awaiting_reconciliation",
        key.key,
        pause_detail("awaiting_reconciliation", tool.name, key.key, key.key),
    )
