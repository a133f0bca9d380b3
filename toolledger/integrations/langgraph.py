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

- **LangChain's `create_agent`** (the `langchain` package, extra `toolledger[langchain]`):
  `create_agent(model, tools=tools.tools, middleware=[tools.middleware()], checkpointer=...)`.
  The middleware's `awrap_tool_call` is this one (LangChain's `AgentMiddleware` hook has the
  same signature), so everything above holds for the agent's tools node.
- **The run's record**: each pause is recorded as the run's pause (`run_paused`, `waiting_on`
  the call) and the answer after it as its resume (toolledger/runtime/framework_runs.py), so the
  console shows the thread paused and `toolledger resumer` calls its hook when the call is
  settled; the hook resumes the thread with `Command(resume=True)` on the same checkpointer.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from toolledger.integrations._calls import Answer, answer_json, make_call
from toolledger.integrations._common import AdapterOptions, ToolNames, call_key_for
from toolledger.integrations._runs import RunPauses
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
    from langchain.agents.middleware import AgentMiddleware

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
        self.runs = RunPauses(ledger, tenant_id)
        self.tools: list[BaseTool] = [_shell(name, tool) for name, tool in self.names.items()]

    def tool_node(self, *, name: str = "tools", **kwargs: Any) -> ToolNode:
        """A `ToolNode` of these tools with the ledger's wrapper (extra tools: `tools=`)."""
        extra = list(kwargs.pop("tools", []))
        return ToolNode(
            [*self.tools, *extra], name=name, awrap_tool_call=self.awrap_tool_call, **kwargs
        )

    def middleware(self) -> AgentMiddleware[Any, Any]:
        """LangChain's `create_agent` middleware whose tool calls go through this wrapper."""
        if importlib.util.find_spec("langchain") is None:  # pragma: no cover - no extra
            raise ImportError(
                "LangGraphTools.middleware() needs LangChain's create_agent: "
                "pip install 'toolledger[langchain]'"
            )
        from langchain.agents.middleware import AgentMiddleware

        wrap = self.awrap_tool_call

        class LedgerMiddleware(AgentMiddleware[Any, Any]):
            """Makes the agent's toolledger tool calls through the ledger (see the module)."""

            name = "toolledger"

            async def awrap_tool_call(
                self, request: ToolCallRequest, handler: Execute
            ) -> ToolMessage | Command[Any]:
                return await wrap(request, handler)

        return LedgerMiddleware()

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
                await self.runs.going_on(key.run_id)
                return ToolMessage(
                    content=answer_json(made),
                    name=call["name"],
                    tool_call_id=key.tool_call_id,
                    status="success" if made.ok else "error",
                )
            await self.runs.paused(made)
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
