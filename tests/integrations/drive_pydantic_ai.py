"""The PydanticAI driver: an agent with the ledger's toolset and a `FunctionModel`.

The message history is saved at each `CallToolsNode` (`agent.iter`), that is after the model
answered and before its tools run: what makes a key stable across a killed process.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from tests.integrations.drivers import PROMPT, TOOLS, Driver, Step
from toolledger.integrations.pydantic_ai import LedgerToolset


class PydanticAIDriver(Driver):
    framework = "pydantic_ai"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.toolset = LedgerToolset(self.ledger, TOOLS, tenant_id="acme", options=self.options)
        self.agent = Agent(
            FunctionModel(self._model),
            toolsets=[self.toolset],
            output_type=[str, DeferredToolRequests],
        )

    def _model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        told = [
            p.model_response_str() if isinstance(p, ToolReturnPart) else str(p.content)
            for m in messages
            for p in m.parts
            if isinstance(p, ToolReturnPart | RetryPromptPart)
        ]
        move = self.decide(told)
        if isinstance(move, str):
            return ModelResponse(parts=[TextPart(move)])
        return ModelResponse(
            parts=[ToolCallPart(move["name"], move["args"], tool_call_id=move["id"])]
        )

    async def _run(
        self,
        thread: str,
        prompt: str | None,
        history: list[ModelMessage] | None,
        results: DeferredToolResults | None = None,
    ) -> Step:
        async with self.agent.iter(
            prompt,
            conversation_id=thread if history is None else None,
            message_history=history,
            deferred_tool_results=results,
        ) as run:
            async for node in run:
                if Agent.is_call_tools_node(node):
                    self._save(thread, {"messages": _dump(run.all_messages())})
            assert run.result is not None
            output = run.result.output
            messages = run.result.all_messages()
        if isinstance(output, DeferredToolRequests):
            self._save(thread, {"messages": _dump(messages), "requests": _requests(output)})
            return _waits(output)
        self._save(thread, {"messages": _dump(messages)})
        return Step(str(output))

    async def start(self, thread: str) -> Step:
        return await self._run(thread, PROMPT, None)

    async def resume(self, thread: str) -> Step:
        saved = self._load(thread)
        history = ModelMessagesTypeAdapter.validate_python(saved["messages"])
        if "requests" not in saved:  # killed mid-tool: the saved history ends in the tool call
            return await self._run(thread, None, history)
        requests = _REQUESTS.validate_python(saved["requests"])
        results = await self.toolset.deferred_results(requests)
        remaining = requests.remaining(results)
        if remaining is not None:
            return _waits(remaining)
        return await self._run(thread, None, history, results)


def _dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json")


_REQUESTS = TypeAdapter(DeferredToolRequests)


def _requests(requests: DeferredToolRequests) -> Any:
    return _REQUESTS.dump_python(requests, mode="json")


def _waits(requests: DeferredToolRequests) -> Step:
    metadata = [requests.metadata[p.tool_call_id] for p in [*requests.calls, *requests.approvals]]
    return Step(
        None,
        [m["waiting_on"] for m in metadata],
        [m["toolledger"] for m in metadata],
        [m["detail"] for m in metadata],
    )
