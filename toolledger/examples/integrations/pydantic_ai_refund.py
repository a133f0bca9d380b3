"""Penny's refund on PydanticAI: the unknown refund is deferred (`CallDeferred`), and resumed.

    python -m toolledger.examples.integrations.pydantic_ai_refund         # offline, one process

    # across processes, on Kafka + PostgreSQL (`toolledger dev up`, a `toolledger projector`):
    python -m toolledger.examples.integrations.pydantic_ai_refund start saved.json
    toolledger executions resolve order-7:call_1 --outcome completed --reason ... --value ...
    python -m toolledger.examples.integrations.pydantic_ai_refund resume saved.json  # elsewhere

The model is a `FunctionModel` (offline). The key is `<conversation_id>:<tool_call_id>`; the
conversation id comes back from the saved message history. `toolset.paused(result)` is what a
later process needs (the `DeferredToolRequests` and the message history), as one JSON text the
application stores; `toolset.resume(agent, saved)` answers the deferred call from the ledger
and runs the agent on. Offline, the resume still starts from nothing but that text (a new
agent, a new toolset), as another process would; the embedded ledger lives in this process, so
only the Kafka + PostgreSQL mode can show a second process.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from toolledger import Ledger
from toolledger.examples.integrations.story import (
    PROMPT,
    REFUND,
    TENANT,
    embedded_ledger,
    operator_settles,
    payments,
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


def penny_agent(ledger: Ledger) -> tuple[Agent[None, str | DeferredToolRequests], LedgerToolset]:
    """What every process builds: the same agent and toolset, nothing remembered."""
    toolset = LedgerToolset(ledger, penny, tenant_id=TENANT)
    agent = Agent(FunctionModel(model), toolsets=[toolset], output_type=[str, DeferredToolRequests])
    return agent, toolset


async def start(ledger: Ledger) -> str:
    """Run until the refund pauses; the JSON text to resume from."""
    agent, toolset = penny_agent(ledger)
    result = await agent.run(PROMPT, conversation_id="order-7")
    paused = toolset.paused(result)
    assert paused is not None, "the slow refund must pause the run"
    pause = paused.pauses[0]
    print(f"paused: {pause.key} {pause.reason} (the model heard nothing)")
    return paused.to_json()


async def resume(ledger: Ledger, saved: str) -> str:
    """Resume from the saved text alone, once the refund is settled: the final answer."""
    agent, toolset = penny_agent(ledger)
    result = await toolset.resume(agent, saved)
    return str(result.output)


async def offline() -> None:
    async with embedded_ledger() as (ledger, olivia):
        saved = await start(ledger)
        await operator_settles(olivia, "order-7:call_1")
        report(await resume(ledger, saved))


async def across_processes(step: str, saved: str) -> str:
    """One step on Kafka + PostgreSQL (`TOOLLEDGER_*`): `start` returns the text to save,
    `resume` takes it."""
    async with await Ledger.connect() as ledger:
        if step == "start":
            paused = await start(ledger)
            for key, payout in payments.made.items():  # what the provider's dashboard shows
                print(f"provider: {payout.model_dump_json()} under {key}")
            return paused
        print(f"penny: {await resume(ledger, saved)}")
        return saved


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("start", "resume"):
        path = Path(sys.argv[2])
        given = path.read_text() if sys.argv[1] == "resume" else ""
        path.write_text(asyncio.run(across_processes(sys.argv[1], given)))
    else:
        asyncio.run(offline())
