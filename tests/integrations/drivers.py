"""One driver per framework, so each scenario is written once and run against all of them.

A driver runs the refund story on its framework with the framework's own offline model (a
LangChain chat model in a LangGraph graph or in LangChain's `create_agent`, a PydanticAI
`FunctionModel`, an `agents` `Model`): the model calls one billing tool (call id `c1`), and
answers with what it heard. `start()` runs until the run ends
or pauses, `resume()` carries on from the framework's own persistence (a LangGraph
checkpointer, a PydanticAI message history, an OpenAI `RunState` JSON), kept in `store` (a
directory, so a new process can resume) or in memory. `heard` is every tool result any model
call was shown, so a test can check that no error text reached the model.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integrations.tools import ARGS, billing
from toolledger import Ledger
from toolledger.integrations import AdapterOptions

FRAMEWORKS = ("langgraph", "langchain_agent", "pydantic_ai", "openai_agents")
PROMPT = "Please refund order 7 (25.00 to acct-7)."


@dataclass
class Step:
    """Where a run stands: its final answer, or the keys it waits on."""

    answer: str | None = None
    paused: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    #: What the adapter told people about each pause (the command that settles it).
    details: list[str] = field(default_factory=list)


class Driver(ABC):
    framework: str

    def __init__(
        self,
        ledger: Ledger,
        *,
        tool: str = "billing__issue_credit",
        retry_unknown: bool = False,
        options: AdapterOptions | None = None,
        store: Path | None = None,
    ) -> None:
        self.ledger = ledger
        self.tool = tool
        self.retry_unknown = retry_unknown
        self.options = options or AdapterOptions()
        self.store = store
        self.heard: list[str] = []
        self.saved: dict[str, Any] = {}

    @abstractmethod
    async def start(self, thread: str) -> Step: ...

    @abstractmethod
    async def resume(self, thread: str) -> Step: ...

    def decide(self, told: Sequence[str]) -> str | dict[str, Any]:
        """The model's next move from the tool results it was shown: a call, or an answer."""
        self.heard.extend(t for t in told if t not in self.heard)
        if not told:
            return {"name": self.tool, "args": ARGS, "id": "c1"}
        if self.retry_unknown and len(told) == 1 and "is unknown" in told[0]:
            return {"name": self.tool, "args": ARGS, "id": "c2"}
        return f"done: {told[-1]}"

    def _save(self, thread: str, value: Any) -> None:
        self.saved[thread] = value
        if self.store is not None:
            # Written whole and renamed into place: two processes resuming one thread save while
            # the other may be reading, and an in-place write let a reader see an empty file
            # (JSONDecodeError in a fresh-clone run). One temporary name per process.
            path = self.store / f"{self.framework}-{thread}.json"
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(value))
            tmp.replace(path)

    def _load(self, thread: str) -> Any:
        if thread in self.saved:
            return self.saved[thread]
        assert self.store is not None, f"nothing saved for thread {thread}"
        return json.loads((self.store / f"{self.framework}-{thread}.json").read_text())


def driver(framework: str, ledger: Ledger, **kwargs: Any) -> Driver:
    if framework == "langgraph":
        from tests.integrations.drive_langgraph import LangGraphDriver

        return LangGraphDriver(ledger, **kwargs)
    if framework == "langchain_agent":
        from tests.integrations.drive_langgraph import LangChainAgentDriver

        return LangChainAgentDriver(ledger, **kwargs)
    if framework == "pydantic_ai":
        from tests.integrations.drive_pydantic_ai import PydanticAIDriver

        return PydanticAIDriver(ledger, **kwargs)
    from tests.integrations.drive_openai_agents import OpenAIAgentsDriver

    return OpenAIAgentsDriver(ledger, **kwargs)


TOOLS = billing
