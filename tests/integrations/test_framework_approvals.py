"""An approval given in the framework alone is not the ledger's decision: the tool must not run.

The runtime holds no signing key (docs/architecture.md, "Security"), so only an operator's
signed event approves a call; a framework's own approval (pydantic-ai `ToolApproved`, the
OpenAI SDK's `state.approve()`) without it must leave the call waiting, and no error text may
reach the model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agents import Runner, RunState
from agents.exceptions import UserError
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from tests.fake_billing import FakeBilling, use_service
from tests.integrations import tools
from tests.integrations.drive_openai_agents import NO_TRACING, OpenAIAgentsDriver
from tests.integrations.drive_pydantic_ai import PydanticAIDriver
from toolledger import Ledger


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    use_service(FakeBilling(tmp_path / "billing.db"))
    tools.behaviour["credit"] = "ok"
    async with await Ledger.memory() as ledger:
        yield ledger


async def test_pydantic_ai_approval_without_the_ledger_asks_again(
    ledger: Ledger, tmp_path: Path
) -> None:
    run = PydanticAIDriver(ledger, tool="billing__refund_large")
    await run.start("t1")
    history = ModelMessagesTypeAdapter.validate_python(run.saved["t1"]["messages"])
    result = await run.agent.run(
        message_history=history, deferred_tool_results=DeferredToolResults(approvals={"c1": True})
    )
    assert isinstance(result.output, DeferredToolRequests)
    assert [p.tool_call_id for p in result.output.approvals] == ["c1"]
    assert FakeBilling(tmp_path / "billing.db").requests() == 0
    assert run.heard == []


async def test_openai_agents_approval_without_the_ledger_stops_the_run(
    ledger: Ledger, tmp_path: Path
) -> None:
    run = OpenAIAgentsDriver(ledger, tool="billing__refund_large")
    await run.start("t1")
    state = await RunState.from_string(run.agent, run.saved["t1"]["state"])
    for item in state.get_interruptions():
        state.approve(item)
    with pytest.raises(UserError, match="the ledger has no decision"):
        await Runner.run(run.agent, state, run_config=NO_TRACING)
    assert FakeBilling(tmp_path / "billing.db").requests() == 0
    assert run.heard == []
