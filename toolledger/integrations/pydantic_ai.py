"""PydanticAI: a toolset whose tools run through the ledger, once per call key.

    toolset = LedgerToolset(ledger, billing, tenant_id="acme")
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    result = await agent.run("refund order 7", conversation_id="order-7")
    if (paused := toolset.paused(result)) is not None:   # unknown, held, or awaiting approval
        save("order-7", paused.to_json())               # the requests and the message history
        ...  # an operator settles the call; later, in any process (the resumer's hook):
        result = await toolset.resume(agent, load("order-7"))

- **The hook** is the toolset (`AbstractToolset`, the way pydantic-ai's own
  `WrapperToolset` and its Temporal integration extend tool execution), with a stable `id`
  (`"toolledger"` by default) so durable-execution wrappers can name its steps.
- **The key** is `<conversation_id>:<tool_call_id>`. Not `run_id`: pydantic-ai gives a run that
  resumes deferred calls a new `run_id`, while the `conversation_id` is read back from the
  message history. So the key is stable exactly when the message history holding the model's
  tool call was saved before the tool ran: a plain process restart loses it (the next run asks
  the model again and gets new call ids) unless the application persists
  `result.all_messages()` (or runs the agent under Temporal, DBOS or Restate, which journal the
  model's answer). A `:` in a conversation id is percent-encoded in the run id.
- **Unknown is a deferral, not an error string**: an unknown call (or one held by the
  duplicate-intent guard) raises `CallDeferred`, so the run ends with `DeferredToolRequests` and
  the model hears nothing meanwhile; `deferred_results()` answers each deferred call from the
  ledger once it is settled (the value, or a `ToolFailed` the model reads), and leaves the
  unsettled ones out (`requests.remaining(results)` lists them).
- **Approvals**: an `external(approval=True)` tool raises `ApprovalRequired`; the decision is
  the operator's signed event in the ledger (API, console or CLI), and `deferred_results()`
  turns it into `ToolApproved` (the tool then runs once, through the ledger) or `ToolDenied`.
- **Pausing and resuming across processes**: `paused(result)` is the run's `PausedRun`: the
  `DeferredToolRequests` and the whole message history, as one JSON text (`to_json()`) the
  application stores (pydantic-ai keeps neither). `resume(agent, saved)` answers every deferred
  call from the ledger and runs the agent on; a call still unsettled raises `RunStillPaused`
  naming it and the command that settles it (pydantic-ai would say `UserError: Tool call
  results need to be provided for all deferred tool calls`), and nothing runs.
- **The run's record**: a deferral is recorded as the run's pause (`run_paused`, `waiting_on`
  the call) and an answer after it as its resume (toolledger/runtime/framework_runs.py), so the
  console shows the run paused and `toolledger resumer` calls its hook when the call is settled.
- **Timeouts are toolledger's**: each call is bounded by its tool's declared `timeout=`, and by
  `Agent(tool_timeout=...)` when that is shorter (pydantic-ai applies it to its own function
  tools only). A write past it is unknown, so the run pauses; the model never hears
  pydantic-ai's "Timed out after N seconds" retry prompt, which would invite a second charge.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import TypeAdapter
from pydantic_core import SchemaValidator

from toolledger.integrations._calls import Answer, Pause, make_call
from toolledger.integrations._common import (
    AdapterOptions,
    CallKey,
    ToolNames,
    call_key_for,
    pause_detail,
    rejected_text,
)
from toolledger.integrations._runs import RunPauses, RunStillPaused
from toolledger.runtime import Ledger, Tool

__all__ = ["CONVERSATION_SOURCE", "LedgerToolset", "PausedRun"]


try:
    from pydantic_ai import Agent, AgentRunResult, RunContext
    from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ToolFailed
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
    from pydantic_ai.tools import (
        DeferredToolRequests,
        DeferredToolResults,
        ToolApproved,
        ToolDefinition,
        ToolDenied,
    )
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "toolledger.integrations.pydantic_ai needs PydanticAI: "
        "pip install 'toolledger[pydantic-ai]'"
    ) from exc

CONVERSATION_SOURCE = "the run's conversation_id (RunContext.conversation_id)"
# Arguments are validated once, by the ledger (the digest is of the validated arguments), and
# a bad one is told to the model from there; pydantic-ai only checks they are an object.
_ANY_OBJECT = cast(SchemaValidator, TypeAdapter(dict[str, Any]).validator)
_REQUESTS: TypeAdapter[DeferredToolRequests] = TypeAdapter(DeferredToolRequests)


@dataclass(frozen=True)
class PausedRun:
    """A run that ended at calls the ledger cannot answer yet: what a later process resumes.

    `requests` and `messages` are everything `LedgerToolset.resume` needs; `to_json()` and
    `from_json()` carry them between processes (pydantic-ai's own JSON for both, so any store
    that keeps text will do).
    """

    pauses: list[Pause]
    requests: DeferredToolRequests
    messages: list[ModelMessage]

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.pauses]

    def to_json(self) -> str:
        requests = _REQUESTS.dump_json(self.requests).decode()
        messages = ModelMessagesTypeAdapter.dump_json(self.messages).decode()
        return f'{{"requests":{requests},"messages":{messages}}}'

    @classmethod
    def from_json(cls, text: str | bytes) -> PausedRun:
        saved = _SAVED.validate_json(text)
        requests = _REQUESTS.validate_python(saved["requests"])
        messages = ModelMessagesTypeAdapter.validate_python(saved["messages"])
        return cls(_pauses_in(requests), requests, messages)


_SAVED: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


class LedgerToolset(AbstractToolset[Any]):
    """A toolset's tools for a pydantic-ai agent; each call goes through the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        tools: Iterable[Tool[Any, Any]],
        *,
        tenant_id: str,
        options: AdapterOptions | None = None,
        id: str = "toolledger",
    ) -> None:
        self.ledger = ledger
        self.tenant_id = tenant_id
        self.options = options or AdapterOptions()
        self.names = ToolNames(tools)
        self.runs = RunPauses(ledger, tenant_id)
        self._id = id
        self._timed: dict[tuple[str, float], Tool[Any, Any]] = {}

    @property
    def id(self) -> str:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=name,
                    parameters_json_schema=tool.arguments_schema,
                    description=(tool.__doc__ or tool.name).strip(),
                ),
                max_retries=1,
                args_validator=_ANY_OBJECT,
            )
            for name, tool in self.names.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """The call's result, or the model's failure text; a pause defers the call."""
        declared = self.names.tool(name)
        if declared is None:
            raise ToolFailed(f"there is no tool named {name!r}")
        key = call_key_for(ctx.conversation_id, ctx.tool_call_id, source=CONVERSATION_SOURCE)
        made = await self._make(self._bounded(declared, ctx), key, tool_args)
        if isinstance(made, Pause):
            await self.runs.paused(made)
            if made.reason == "awaiting_approval":
                raise ApprovalRequired(metadata=made.payload())
            raise CallDeferred(metadata=made.payload())
        await self.runs.going_on(key.run_id)
        return _told(made)

    def _bounded(self, tool: Tool[Any, Any], ctx: RunContext[Any]) -> Tool[Any, Any]:
        """The tool, with the agent's `tool_timeout` as its timeout when that is shorter."""
        # pydantic-ai keeps the agent's default privately and applies it only to its own
        # function toolset; read it where it lives, and ignore it if it moved.
        limit = getattr(ctx.agent, "_tool_timeout", None)
        if not isinstance(limit, int | float) or limit <= 0 or limit >= tool.timeout:
            return tool
        timed = self._timed.get((tool.name, float(limit)))
        if timed is None:
            timed = copy.copy(tool)
            timed.timeout = float(limit)
            self._timed[(tool.name, float(limit))] = timed
        return timed

    async def _make(
        self, tool: Tool[Any, Any], key: CallKey, arguments: dict[str, Any]
    ) -> Answer | Pause:
        return await make_call(
            self.ledger,
            tool,
            key,
            tenant_id=self.tenant_id,
            arguments=arguments,
            options=self.options,
        )

    def paused(self, result: AgentRunResult[Any]) -> PausedRun | None:
        """The calls of this toolset a run ended at, with what resumes it; None if it did not."""
        if not isinstance(result.output, DeferredToolRequests):
            return None
        pauses = _pauses_in(result.output)
        if not pauses:
            return None
        return PausedRun(pauses, result.output, result.all_messages())

    async def resume(
        self, agent: Agent[Any, Any], paused: PausedRun | str | bytes, **run_kwargs: Any
    ) -> AgentRunResult[Any]:
        """Run a paused run on, in any process, once the ledger settled every call it waits on.

        `paused` is `paused(result)` or its `to_json()`. Each deferred call is answered from
        the ledger (`deferred_results`); if one is still unsettled or undecided, raises
        `RunStillPaused` naming it and the command that settles it, and runs nothing.
        `run_kwargs` go to `agent.run` (deps, usage limits...).
        """
        if not isinstance(paused, PausedRun):
            paused = PausedRun.from_json(paused)
        results, waiting = await self._answers(paused.requests)
        if waiting:
            raise RunStillPaused(waiting[0].key.partition(":")[0], waiting)
        return await agent.run(
            message_history=paused.messages, deferred_tool_results=results, **run_kwargs
        )

    async def deferred_results(self, requests: DeferredToolRequests) -> DeferredToolResults:
        """The ledger's answers to the calls a run deferred; calls still unsettled are left out.

        Approvals: `ToolApproved` once an operator approved (the tool then runs, once),
        `ToolDenied` once rejected. Deferred calls: the settled result (or a `ToolFailed` with
        what the model should hear). `requests.remaining(results)` lists the ones left out;
        `resume()` raises `RunStillPaused` for them instead.
        """
        return (await self._answers(requests))[0]

    async def _answers(
        self, requests: DeferredToolRequests
    ) -> tuple[DeferredToolResults, list[Pause]]:
        results = DeferredToolResults()
        waiting: list[Pause] = []
        for part in requests.approvals:
            key = _key_of(requests, part.tool_call_id)
            if key is None:
                continue
            record = await self.ledger.read_call(key)
            if record is None or record.status == "awaiting_approval":
                tool = record.tool if record is not None else part.tool_name
                waiting.append(_approval_pause(tool, key))
                await self.runs.paused(waiting[-1])
                continue
            if record.status == "failed" and record.settled_by == "operator":
                results.approvals[part.tool_call_id] = ToolDenied(
                    rejected_text(record.tool, record.reason)
                )
            else:
                results.approvals[part.tool_call_id] = ToolApproved()
        for part in requests.calls:
            declared = self.names.tool(part.tool_name)
            key = _key_of(requests, part.tool_call_id)
            if declared is None or key is None:
                continue
            run_id, _, call_id = key.partition(":")
            made = await self._make(declared, CallKey(run_id, call_id), part.args_as_dict())
            if isinstance(made, Pause):
                waiting.append(made)
                await self.runs.paused(made)
                continue
            results.calls[part.tool_call_id] = (
                made.value if made.ok and made.same_as is None else _failure(made)
            )
        if not waiting:  # the run may go on: every deferred call has its answer
            for run_id in {k.partition(":")[0] for k in _keys(requests)}:
                await self.runs.going_on(run_id)
        return results, waiting


def _told(answer: Answer) -> Any:
    if answer.ok and answer.same_as is None:
        return answer.value
    if answer.ok:
        return answer.text
    raise ToolFailed(answer.text)


def _failure(answer: Answer) -> Any:
    return answer.text if answer.ok else ToolFailed(answer.text)


def _key_of(requests: DeferredToolRequests, tool_call_id: str) -> str | None:
    """The key this toolset put in the deferral's metadata (None: not one of its calls)."""
    metadata = requests.metadata.get(tool_call_id) or {}
    key = metadata.get("key")
    return key if isinstance(key, str) and metadata.get("toolledger") else None


def _keys(requests: DeferredToolRequests) -> list[str]:
    parts = [*requests.calls, *requests.approvals]
    return [k for k in (_key_of(requests, p.tool_call_id) for p in parts) if k is not None]


def _approval_pause(tool: str, key: str) -> Pause:
    detail = pause_detail("awaiting_approval", tool, key, key)
    return Pause(key, tool, "awaiting_approval", key, detail)


def _pauses_in(requests: DeferredToolRequests) -> list[Pause]:
    """The pauses this toolset put in a run's deferral metadata, as `Pause`s."""
    pauses = []
    for part in [*requests.calls, *requests.approvals]:
        metadata = requests.metadata.get(part.tool_call_id) or {}
        if _key_of(requests, part.tool_call_id) is not None:
            pauses.append(
                Pause(
                    metadata["key"],
                    metadata["tool"],
                    metadata["toolledger"],
                    metadata["waiting_on"],
                    metadata.get("detail", ""),
                )
            )
    return pauses
