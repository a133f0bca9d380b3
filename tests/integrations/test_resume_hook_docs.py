"""What the resume-hook docs tell a user to write must work as written.

The hooks imported `RunRecord` from `toolledger.events.records`, a private module; they kept a
module-global `Ledger` that nobody closed (the resumer's shutdown then printed `Unclosed
AIOKafkaProducer`: tests/integration/test_resumer.py checks the documented per-resume ledger
leaves nothing open); and LangGraph's hook resumed "on the checkpointer every process shares"
while `toolledger[langgraph]` installed none that outlives a process.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from langchain_core.language_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from toolledger import Ledger, ToolContext, Toolset, external
from toolledger.integrations.langgraph import LangGraphTools
from toolledger.testing import Operator

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

billing = Toolset("billing")
refunds: list[str] = []


@billing.tool(external(approval=True))
async def refund(account_id: str, amount_cents: int, context: ToolContext) -> str:
    """Refund an account (an operator approves it first)."""
    refunds.append(context.idempotency_key)
    return f"refunded {amount_cents} to {account_id}"


def test_the_docs_import_run_record_from_its_public_name() -> None:
    private = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in DOCS
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"from toolledger\.events\.records import .*RunRecord", line)
    ]
    assert private == [], "use `from toolledger import RunRecord`"


def test_the_langgraph_extra_installs_the_checkpointer_the_docs_name() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    langgraph = extras["optional-dependencies"]["langgraph"]
    assert any(r.startswith("langgraph-checkpoint-sqlite") for r in langgraph), langgraph
    page = (ROOT / "docs" / "integrations" / "langgraph.md").read_text()
    assert "AsyncSqliteSaver" in page and "langgraph-checkpoint-postgres" in page


def _graph(tools: LangGraphTools) -> StateGraph[MessagesState]:
    call = {"name": "billing__refund", "id": "c1", "args": {"account_id": "a", "amount_cents": 5}}
    model = FakeMessagesListChatModel(
        responses=[AIMessage("", tool_calls=[call]), AIMessage("Refunded.")]
    )

    async def agent(state: MessagesState) -> dict[str, object]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools.tool_node())
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph


async def test_a_thread_paused_under_one_checkpointer_connection_resumes_under_another(
    tmp_path: Path,
) -> None:
    """The documented hook opens the SQLite checkpointer afresh, as another process would:
    the thread paused on an approval must resume from that file, and refund once."""
    refunds.clear()
    path = str(tmp_path / "checkpoints.sqlite")
    config: RunnableConfig = {"configurable": {"thread_id": "order-7"}}
    async with await Ledger.memory() as ledger:
        tools = LangGraphTools(ledger, billing, tenant_id="acme")
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            app = _graph(tools).compile(checkpointer=saver)
            start: MessagesState = {"messages": [HumanMessage("refund order 7")]}
            out = await app.ainvoke(start, config)
            key = out["__interrupt__"][0].value["key"]
        await Operator(ledger).approve(key, reason="the customer is right")
        async with AsyncSqliteSaver.from_conn_string(path) as saver:  # the hook's own
            app = _graph(tools).compile(checkpointer=saver)
            out = await app.ainvoke(Command(resume=True), config)
    assert out["messages"][-1].content == "Refunded."
    assert refunds == ["order-7:c1"]
