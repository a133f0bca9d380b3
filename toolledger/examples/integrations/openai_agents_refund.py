"""Penny's refund on the OpenAI Agents SDK: the unknown refund stops the run as an
interruption, with a `RunState` JSON to resume from.

    python -m toolledger.examples.integrations.openai_agents_refund

The model is a scripted `agents` `Model` (offline). The run id is the application's
(`context={"run_id": ...}`); the call id is the model's, saved in the `RunState` JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelSettings, RunConfig, Runner, Usage
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.testing.model import assistant_message, function_call

from toolledger.examples.integrations.story import (
    PROMPT,
    REFUND,
    TENANT,
    embedded_ledger,
    operator_settles,
    penny,
    report,
)
from toolledger.integrations.openai_agents import OpenAIAgentsTools


class Penny(Model):
    """Refunds once, then tells the customer what the tool said."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else [dict(i) for i in input]
        told = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
        output = (
            assistant_message(f"Your refund went through: {told[-1]}")
            if told
            else function_call("penny__refund", REFUND, call_id="call_1")
        )
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


async def main() -> None:
    offline = RunConfig(tracing_disabled=True)
    async with embedded_ledger() as (ledger, olivia):
        tools = OpenAIAgentsTools(ledger, penny, tenant_id=TENANT)
        agent = Agent(name="penny", instructions="Refund orders.", tools=tools.tools, model=Penny())
        result = await Runner.run(agent, PROMPT, context={"run_id": "order-7"}, run_config=offline)
        paused = tools.paused(result)
        assert paused is not None
        saved = paused.state_json  # what a real application writes to its database
        print(f"paused: {paused.keys[0]} {paused.pauses[0].reason} (the model heard nothing)")
        await operator_settles(olivia, paused.keys[0])
        state = await tools.resume(agent, saved)
        result = await Runner.run(agent, state, run_config=offline)
        report(str(result.final_output))


if __name__ == "__main__":
    asyncio.run(main())
