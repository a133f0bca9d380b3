"""OpenAI Agents SDK pieces the integration tests and their worker processes share.

`ScriptedModel` is a real `agents.models.interface.Model` whose response is a pure function of
the input items so far, so a run resumed in another process from its `RunState` JSON asks it
the same question and gets the same call ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from agents import Agent, ModelSettings, Usage
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.testing.model import assistant_message, function_call

from toolledger.integrations.openai_agents import OpenAIAgentsTools

ARGS = {"account_id": "acct-7", "amount_cents": 2500}
Script = Callable[[Sequence[dict[str, Any]]], list[Any]]


class ScriptedModel(Model):
    """Answers `script(input items)`; records every input it was shown."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[list[dict[str, Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        shown = [dict(i) if isinstance(i, dict) else i.model_dump() for i in items]  # type: ignore[union-attr]
        self.seen.append(shown)
        return ModelResponse(output=self.script(shown), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the tests run without streaming")


def outputs(items: Sequence[dict[str, Any]]) -> list[str]:
    """The tool outputs the model has been shown, in order."""
    return [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]


def refund_script(tool: str = "billing__issue_credit", *, retry_unknown: bool = False) -> Script:
    """Call `tool` once (call id c1); then answer with what it heard. With `retry_unknown` a
    model told the outcome is unknown calls again under a new id (c2)."""

    def script(items: Sequence[dict[str, Any]]) -> list[Any]:
        told = outputs(items)
        if not told:
            return [function_call(tool, ARGS, call_id="c1")]
        if retry_unknown and len(told) == 1 and '"indeterminate"' in told[0]:
            return [function_call(tool, ARGS, call_id="c2")]
        return [assistant_message(f"done: {told[-1]}")]

    return script


def refund_agent(tools: OpenAIAgentsTools, model: Model) -> Agent[Any]:
    return Agent(name="refunds", instructions="Refund orders.", tools=list(tools.tools), model=model)


def dump(value: Any) -> str:
    return json.dumps(value, default=str)
