"""PydanticAI: a toolset whose tools run through the ledger, once per call key.

    toolset = LedgerToolset(ledger, billing, tenant_id="acme")
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    result = await agent.run("refund order 7")
    if isinstance(result.output, DeferredToolRequests):       # paused: unknown or approval
        ...  # an operator settles the call over the API, later, in any process:
        results = await toolset.deferred_results(result.output)
        result = await agent.run(message_history=result.all_messages(),
                                 deferred_tool_results=results)

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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from pydantic import TypeAdapter
from pydantic_core import SchemaValidator

from toolledger.integrations._calls import Answer, Pause, make_call
from toolledger.integrations._common import (
    AdapterOptions,
    CallKey,
    ToolNames,
    call_key_for,
    rejected_text,
)
from toolledger.runtime import Ledger, Tool

__all__ = ["CONVERSATION_SOURCE", "LedgerToolset"]


try:
    from pydantic_ai import RunContext
    from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ToolFailed
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
        self._id = id

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
        made = await self._make(declared, key, tool_args)
        if isinstance(made, Pause):
            if made.reason == "awaiting_approval":
                raise ApprovalRequired(metadata=made.payload())
            raise CallDeferred(metadata=made.payload())
        return _told(made)

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

    async def deferred_results(self, requests: DeferredToolRequests) -> DeferredToolResults:
        """The ledger's answers to the calls a run deferred; calls still unsettled are left out.

        Approvals: `ToolApproved` once an operator approved (the tool then runs, once),
        `ToolDenied` once rejected. Deferred calls: the settled result (or a `ToolFailed` with
        what the model should hear).
        """
        results = DeferredToolResults()
        for part in requests.approvals:
            key = _key_of(requests, part.tool_call_id)
            if key is None:
                continue
            record = await self.ledger.read_call(key)
            if record is None or record.status == "awaiting_approval":
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
            if isinstance(made, Answer):
                results.calls[part.tool_call_id] = (
                    made.value if made.ok and made.same_as is None else _failure(made)
                )
        return results


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
