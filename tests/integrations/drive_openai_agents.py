"""The OpenAI Agents SDK driver: an agent with the ledger's `FunctionTool`s and a scripted
`agents.models.interface.Model`; a paused run's `RunState` JSON is what resumes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelSettings, RunConfig, Runner, RunResult, Usage
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.testing.model import assistant_message, function_call

from tests.integrations.drivers import PROMPT, TOOLS, Driver, Step
from toolledger.integrations.openai_agents import OpenAIAgentsTools

NO_TRACING = RunConfig(tracing_disabled=True)


class ScriptedModel(Model):
    """A model whose response is `driver.decide(tool outputs in the input so far)`."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items: list[Any] = [] if isinstance(input, str) else list(input)
        told = [
            str(i.get("output"))
            for i in (dict(i) for i in items)
            if i.get("type") == "function_call_output"
        ]
        move = self.driver.decide(told)
        output = (
            assistant_message(move)
            if isinstance(move, str)
            else function_call(move["name"], move["args"], call_id=move["id"])
        )
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("these runs do not stream")


class OpenAIAgentsDriver(Driver):
    framework = "openai_agents"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools = OpenAIAgentsTools(self.ledger, TOOLS, tenant_id="acme", options=self.options)
        self.agent: Agent[Any] = Agent(
            name="refunds",
            instructions="Refund orders.",
            tools=list(self.tools.tools),
            model=ScriptedModel(self),
        )

    def _step(self, thread: str, result: RunResult) -> Step:
        paused = self.tools.paused(result)
        if paused is None:
            return Step(str(result.final_output))
        self._save(thread, {"state": paused.state_json})
        pauses = paused.pauses
        return Step(
            None,
            [p.waiting_on for p in pauses],
            [p.reason for p in pauses],
            [p.detail for p in pauses],
        )

    async def start(self, thread: str) -> Step:
        result = await Runner.run(
            self.agent, PROMPT, context={"run_id": thread}, run_config=NO_TRACING
        )
        return self._step(thread, result)

    async def resume(self, thread: str) -> Step:
        state = await self.tools.resume(self.agent, self._load(thread)["state"])
        result = await Runner.run(self.agent, state, run_config=NO_TRACING)
        return self._step(thread, result)
