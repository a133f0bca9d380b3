"""Penny's refund on PydanticAI: the unknown refund is deferred (`CallDeferred`).

    python -m examples.integrations.pydantic_ai_refund

The model is a `FunctionModel` (offline). The key is `<conversation_id>:<tool_call_id>`; the
conversation id comes back from the saved message history, so a resume in another process
(from `result.all_messages()`, saved) asks the ledger about the same key.
"""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from examples.integrations.story import (
    PROMPT,
    REFUND,
    TENANT,
    embedded_ledger,
    operator_settles,
    penny,
    report,
)
from toolledger.integrations.pydantic_ai import LedgerToolset


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Refunds once, then tells the customer what the tool said."""
    told = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if told:
        return ModelResponse(parts=[TextPart(f"Your refund went through: {told[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("penny__refund", REFUND, tool_call_id="call_1")])


async def main() -> None:
    async with embedded_ledger() as (ledger, olivia):
        toolset = LedgerToolset(ledger, penny, tenant_id=TENANT)
        agent = Agent(
            FunctionModel(model), toolsets=[toolset], output_type=[str, DeferredToolRequests]
        )
        result = await agent.run(PROMPT, conversation_id="order-7")
        assert isinstance(result.output, DeferredToolRequests)
        paused = result.output.metadata["call_1"]
        print(f"paused: {paused['key']} {paused['toolledger']} (the model heard nothing)")
        await operator_settles(olivia, paused["key"])
        results = await toolset.deferred_results(result.output)
        result = await agent.run(
            message_history=result.all_messages(), deferred_tool_results=results
        )
        report(str(result.output))


if __name__ == "__main__":
    asyncio.run(main())
