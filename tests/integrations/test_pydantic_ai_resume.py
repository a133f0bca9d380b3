"""PydanticAI runs pause and resume through `LedgerToolset.paused()` and `resume()`.

A resume before the ledger settled the call must be toolledger's `RunStillPaused`, naming the
call and the command that settles it, never pydantic-ai's `UserError` about missing deferred
results; and `Agent(tool_timeout=...)`, which pydantic-ai applies to its own function tools
only, bounds the ledger's call too (a write past it is unknown, so the run pauses).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from tests.fake_billing import FakeBilling, service, use_service
from tests.integrations import tools
from toolledger import Ledger, ToolContext, Toolset, external
from toolledger.integrations import RunStillPaused
from toolledger.integrations.pydantic_ai import LedgerToolset, PausedRun
from toolledger.testing import Operator

slow = Toolset("slow")
sent: list[str] = []


@slow.tool(external(), timeout=30)
async def transfer(amount_cents: int, context: ToolContext) -> str:
    """A transfer whose bank answers after 5 s (the money left at once)."""
    async with context.sending():
        sent.append(context.idempotency_key)
        await asyncio.sleep(5)
        return "tr_1"


def model(tool: str, args: dict[str, Any]) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        told = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if told:
            return ModelResponse(parts=[TextPart(f"done: {told[-1].model_response_str()}")])
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id="c1")])

    return FunctionModel(answer)


@pytest.fixture(autouse=True)
def _services(tmp_path: Path) -> None:
    """The fake billing system judges the refunds; `sent` the transfers."""
    use_service(FakeBilling(tmp_path / "billing.db"))
    tools.behaviour["credit"] = "ok"
    sent.clear()


@pytest.fixture
async def ledger() -> AsyncIterator[Ledger]:
    async with await Ledger.memory() as ledger:
        yield ledger


def refund_agent(ledger: Ledger) -> tuple[Agent[None, str | DeferredToolRequests], LedgerToolset]:
    toolset = LedgerToolset(ledger, tools.billing, tenant_id="acme")
    agent = Agent(
        model("billing__refund_large", tools.ARGS),
        toolsets=[toolset],
        output_type=[str, DeferredToolRequests],
    )
    return agent, toolset


async def test_a_resume_before_the_decision_is_toolledgers_error_not_a_user_error(
    ledger: Ledger,
) -> None:
    """pydantic-ai said `UserError: Tool call results need to be provided for all deferred
    tool calls`; the person resuming must learn which call waits and how to settle it."""
    agent, toolset = refund_agent(ledger)
    paused = toolset.paused(await agent.run("refund", conversation_id="order-7"))
    assert paused is not None and paused.keys == ["order-7:c1"]
    saved = paused.to_json()
    again, elsewhere = refund_agent(ledger)  # another process: nothing but the saved text
    with pytest.raises(RunStillPaused) as early:
        await elsewhere.resume(again, saved)
    assert early.value.code == "run_still_paused"
    assert "run order-7 cannot go on yet" in str(early.value)
    assert "toolledger executions approve order-7:c1" in str(early.value)
    await Operator(ledger).approve("order-7:c1", reason="the customer is right")
    result = await elsewhere.resume(again, PausedRun.from_json(saved))
    assert isinstance(result.output, str) and "cr_" in result.output
    assert service().effects() == 1


async def test_the_agents_tool_timeout_bounds_the_ledgers_call(ledger: Ledger) -> None:
    """`Agent(tool_timeout=0.2)` was ignored by the toolset: the transfer ran its 5 s and the
    run went on. Honoured, the transfer is unknown after 0.2 s and the run pauses; the model
    never hears pydantic-ai's "Timed out after ... seconds" retry prompt."""
    toolset = LedgerToolset(ledger, slow, tenant_id="acme")
    agent = Agent(
        model("slow__transfer", {"amount_cents": 100}),
        toolsets=[toolset],
        output_type=[str, DeferredToolRequests],
        tool_timeout=0.2,
    )
    async with asyncio.timeout(3):
        result = await agent.run("transfer", conversation_id="t1")
    paused = toolset.paused(result)
    assert paused is not None
    assert [(p.key, p.reason) for p in paused.pauses] == [("t1:c1", "awaiting_reconciliation")]
    record = await ledger.read_call("t1:c1")
    assert record is not None and record.status == "indeterminate"
    assert sent == ["t1:c1"]
