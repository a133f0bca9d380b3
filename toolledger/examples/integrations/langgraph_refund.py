"""Penny's refund on LangGraph: the unknown refund pauses the graph with `interrupt()`.

    python -m toolledger.examples.integrations.langgraph_refund

The model is a scripted LangChain chat model (offline). The graph's checkpointer saves the
model's tool call before the tools node runs, so the key `<thread_id>:<tool_call_id>` is the
same in whichever process resumes the thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from toolledger.examples.integrations.story import (
    PROMPT,
    REFUND,
    TENANT,
    embedded_ledger,
    operator_settles,
    penny,
    report,
)
from toolledger.integrations.langgraph import LangGraphTools


class Penny(BaseChatModel):
    """Refunds once, then tells the customer what the tool said."""

    @property
    def _llm_type(self) -> str:
        return "penny"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Penny:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        told = [m for m in messages if isinstance(m, ToolMessage)]
        if told:
            message = AIMessage(f"Your refund went through: {told[-1].content}")
        else:
            message = AIMessage(
                "", tool_calls=[{"name": "penny__refund", "args": REFUND, "id": "call_1"}]
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


async def main() -> None:
    async with embedded_ledger() as (ledger, olivia):
        tools = LangGraphTools(ledger, penny, tenant_id=TENANT)
        model = Penny().bind_tools(tools.tools)

        async def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools.tool_node())
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        app = graph.compile(checkpointer=InMemorySaver())

        config: RunnableConfig = {"configurable": {"thread_id": "order-7"}}
        start: MessagesState = {"messages": [HumanMessage(PROMPT)]}
        out = await app.ainvoke(start, config)
        paused = out["__interrupt__"][0].value
        print(f"paused: {paused['key']} {paused['toolledger']} (the model heard nothing)")
        await operator_settles(olivia, paused["key"])
        resume: Command[Any] = Command(resume=True)
        out = await app.ainvoke(resume, config)
        report(out["messages"][-1].content)


if __name__ == "__main__":
    asyncio.run(main())
