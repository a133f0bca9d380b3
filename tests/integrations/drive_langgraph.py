"""The LangGraph driver: a model node and a `ToolNode` with the ledger's wrapper."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, RetryPolicy

from tests.integrations.drivers import PROMPT, TOOLS, Driver, Step
from tests.integrations.lg_support import FileSaver
from toolledger.integrations.langgraph import LangGraphTools


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model whose answer is `driver.decide(tool results so far)`."""

    driver: Any

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        told = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        move = self.driver.decide(told)
        if isinstance(move, str):
            message = AIMessage(move)
        else:
            message = AIMessage("", tool_calls=move if isinstance(move, list) else [move])
        return ChatResult(generations=[ChatGeneration(message=message)])


class LangGraphDriver(Driver):
    framework = "langgraph"

    def __init__(self, *args: Any, node_retry: RetryPolicy | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools = LangGraphTools(self.ledger, TOOLS, tenant_id="acme", options=self.options)
        saver = InMemorySaver() if self.store is None else FileSaver(self.store / "lg.pickle")
        self.extra_tools: list[Any] = []
        self.node_retry = node_retry
        self.saver = saver
        self.graph = self._graph()

    def _graph(self) -> Any:
        model = ScriptedChatModel(driver=self).bind_tools(self.tools.tools)

        async def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node(
            "tools", self.tools.tool_node(tools=self.extra_tools), retry_policy=self.node_retry
        )
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph.compile(checkpointer=self.saver)

    def with_tools(self, extra: Sequence[Any], model_calls: Any) -> None:
        """Rebuild the graph with more (plain LangChain) tools and another model script."""
        self.extra_tools = list(extra)
        self.decide = model_calls  # type: ignore[method-assign]
        self.graph = self._graph()

    async def start(self, thread: str) -> Step:
        config = {"configurable": {"thread_id": thread}}
        return _step(await self.graph.ainvoke({"messages": [("user", PROMPT)]}, config))

    async def resume(self, thread: str) -> Step:
        """Answer the pause, or (after a crash, no pause) carry on from the last checkpoint."""
        config = {"configurable": {"thread_id": thread}}
        paused = (await self.graph.aget_state(config)).interrupts
        return _step(await self.graph.ainvoke(Command(resume=True) if paused else None, config))


def _step(out: dict[str, Any]) -> Step:
    interrupts = out.get("__interrupt__") or []
    if interrupts:
        values = [i.value for i in interrupts]
        return Step(
            None,
            [v["waiting_on"] for v in values],
            [v["toolledger"] for v in values],
            [v["detail"] for v in values],
        )
    return Step(str(out["messages"][-1].content))


class LangChainAgentDriver(LangGraphDriver):
    """LangChain's `create_agent` with the ledger's middleware, on the same checkpointer."""

    framework = "langchain_agent"

    def _graph(self) -> Any:
        from langchain.agents import create_agent

        return create_agent(
            ScriptedChatModel(driver=self),
            tools=[*self.tools.tools, *self.extra_tools],
            middleware=[self.tools.middleware()],
            checkpointer=self.saver,
        )
