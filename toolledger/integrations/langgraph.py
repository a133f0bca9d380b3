"""LangGraph: a `ToolNode` whose toolledger tools run through the ledger, once per call key.

    tools = LangGraphTools(ledger, billing, tenant_id="acme")
    model = chat_model.bind_tools(tools.tools)
    graph.add_node("tools", tools.tool_node())   # ToolNode(tools.tools, awrap_tool_call=...)
    graph.compile(checkpointer=...)  # the thread_id is the run id

- **The hook** is `ToolNode(..., awrap_tool_call=tools.awrap_tool_call)`, the interceptor
  LangGraph gives every tool call (langgraph/prebuilt/tool_node.py). Calls of other tools in the
  same node pass through to `execute` untouched.
- **The key** is `<thread_id>:<tool_call_id>`: the thread id is what a checkpointer resumes by,
  and the tool call id comes from the model's `AIMessage`, which the checkpointer saved when
  the model node finished, before the tools node ran. So a process killed mid-tool, resumed on
  the same thread in any process, makes the same calls under the same keys and gets the
  ledger's answers. Without a checkpointer nothing saved that message; a `thread_id` is then
  still required, and the key is stable only as long as the caller replays the same messages.
  A `:` in the thread id is percent-encoded in the run id (`user%3A42`), never split.
- **Unknown is a pause, not an error string**: an unknown call (or one held by the
  duplicate-intent guard, or awaiting approval) calls `interrupt()` with the key and why. The
  graph stops without a `ToolMessage`, so the model hears nothing meanwhile. Once an operator
  (or the reconciler) has settled the call, `graph.ainvoke(Command(resume=True), config)`
  re-runs the node: the calls are asked of the ledger again and the model hears the truth.
  The resume value itself is not read: the ledger is the truth, not the resumer.
- **Approvals**: an `external(approval=True)` tool pauses the same way until an operator
  approves or rejects it over the API (the signed decision is the ledger's event); a rejected
  call tells the model it did not run.

The `create_agent` middleware of the `langchain` package is not offered: that package is not
part of the `langgraph` extra, and its `AgentMiddleware.awrap_tool_call` has the same
signature as `awrap_tool_call` here, so `tools.awrap_tool_call` can be wrapped in one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from toolledger.integrations._calls import Answer, answer_json, make_call
from toolledger.integrations._common import AdapterOptions, ToolNames, call_key_for
from toolledger.runtime import Ledger, Tool

__all__ = ["THREAD_ID_SOURCE", "LangGraphTools"]


try:
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command, interrupt
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "toolledger.integrations.langgraph needs LangGraph: pip install 'toolledger[langgraph]'"
    ) from exc

if TYPE_CHECKING:
    Execute = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]

THREAD_ID_SOURCE = 'config["configurable"]["thread_id"]'


class LangGraphTools:
    """A toolset's tools for LangGraph, and the `ToolNode` wrapper that ledgers their calls."""

    def __init__(
        self,
        ledger: Ledger,
        tools: Iterable[Tool[Any, Any]],
        *,
        tenant_id: str,
        options: AdapterOptions | None = None,
    ) -> None:
        self.ledger = ledger
        self.tenant_id = tenant_id
        self.options = options or AdapterOptions()
        self.names = ToolNames(tools)
        self.tools: list[BaseTool] = [_shell(name, tool) for name, tool in self.names.items()]

    def tool_node(self, *, name: str = "tools", **kwargs: Any) -> ToolNode:
        """A `ToolNode` of these tools with the ledger's wrapper (extra tools: `tools=`)."""
        extra = list(kwargs.pop("tools", []))
        return ToolNode(
            [*self.tools, *extra], name=name, awrap_tool_call=self.awrap_tool_call, **kwargs
        )

    async def awrap_tool_call(
        self, request: ToolCallRequest, execute: Execute
    ) -> ToolMessage | Command[Any]:
        """Make the call through the ledger, or pause the graph with `interrupt()`."""
        call = request.tool_call
        tool = self.names.tool(call["name"])
        if tool is None:
            return await execute(request)
        configurable = (request.runtime.config or {}).get("configurable", {})
        key = call_key_for(configurable.get("thread_id"), call.get("id"), source=THREAD_ID_SOURCE)
        while True:
            made = await make_call(
                self.ledger,
                tool,
                key,
                tenant_id=self.tenant_id,
                arguments=call["args"],
                options=self.options,
            )
            if isinstance(made, Answer):
                return ToolMessage(
                    content=answer_json(made),
                    name=call["name"],
                    tool_call_id=key.tool_call_id,
                    status="success" if made.ok else "error",
                )
            # Raises GraphInterrupt the first time; on resume returns, and the loop asks the
            # ledger again (a call still unsettled interrupts anew).
            interrupt(made.payload())


def _shell(name: str, tool: Tool[Any, Any]) -> BaseTool:
    """The tool as the model and `ToolNode` see it; it runs only through the wrapper."""

    async def refuse(**_: Any) -> str:
        raise RuntimeError(
            f"{tool.name} runs only through the ledger: put it in "
            "LangGraphTools.tool_node() (or a ToolNode with awrap_tool_call=tools.awrap_tool_call)"
        )

    return StructuredTool(
        name=name,
        description=(tool.__doc__ or tool.name).strip(),
        args_schema=tool.arguments_schema,
        coroutine=refuse,
    )
