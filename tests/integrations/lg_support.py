"""LangGraph pieces the integration tests and their worker processes share.

`ScriptedChatModel` is a real LangChain chat model (a `BaseChatModel` that can bind tools)
whose answers are a pure function of the messages so far, so a graph resumed in another
process asks it the same question and gets the same tool call ids. `FileSaver` is LangGraph's
own `InMemorySaver` over its `PersistentDict`, written to a file after every checkpoint: the
persistence a new process resumes from.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition

from toolledger.integrations.langgraph import LangGraphTools

Script = Callable[[Sequence[BaseMessage]], AIMessage]

ARGS = {"account_id": "acct-7", "amount_cents": 2500}


class ScriptedChatModel(BaseChatModel):
    """Answers with `script(messages)`; records every list of messages it was shown."""

    script: Script
    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.script(messages))])


def tool_messages(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def refund_script(tool: str = "billing__issue_credit", *, retry_unknown: bool = False) -> Script:
    """Call `tool` once (id c1); then answer with what it heard. With `retry_unknown` a model
    told the outcome is unknown calls again under a new id (c2), as models do."""

    def script(messages: Sequence[BaseMessage]) -> AIMessage:
        told = tool_messages(messages)
        if not told:
            return AIMessage("", tool_calls=[{"name": tool, "args": ARGS, "id": "c1"}])
        last = str(told[-1].content)
        if retry_unknown and len(told) == 1 and '"indeterminate"' in last:
            return AIMessage("", tool_calls=[{"name": tool, "args": ARGS, "id": "c2"}])
        return AIMessage(f"done: {last}")

    return script


def build_graph(
    tools: LangGraphTools, model: BaseChatModel, checkpointer: Any
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The usual agent graph: model, then tools while the model asks for them."""
    bound = model.bind_tools(tools.tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools.tool_node())
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


class FileSaver(InMemorySaver):
    """LangGraph's `InMemorySaver`, written to a file after every checkpoint and write and
    read back when a process opens it: what a new process resumes a thread from."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        if path.exists():
            storage, writes, blobs = pickle.loads(path.read_bytes())  # noqa: S301 - our file
            for thread, namespaces in storage.items():
                for namespace, checkpoints in namespaces.items():
                    self.storage[thread][namespace].update(checkpoints)
            self.writes.update(writes)
            self.blobs.update(blobs)

    def _save(self) -> None:
        storage = {t: {n: dict(c) for n, c in ns.items()} for t, ns in self.storage.items()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps((storage, dict(self.writes), dict(self.blobs))))
        tmp.replace(self.path)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        saved = super().put(*args, **kwargs)
        self._save()
        return saved

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        super().put_writes(*args, **kwargs)
        self._save()


def dump(value: Any) -> str:
    return json.dumps(value, default=str)
