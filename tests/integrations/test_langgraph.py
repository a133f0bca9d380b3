"""LangGraph specifics: its own node retry re-runs every call of the node, and other tools in
the same `ToolNode` pass through the wrapper untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.types import RetryPolicy

from tests.fake_billing import FakeBilling, use_service
from tests.integrations import tools
from tests.integrations.drive_langgraph import LangGraphDriver
from tests.integrations.tools import ARGS
from toolledger import Ledger

flaky_calls: list[str] = []


@tool
async def look_up_order(order: str) -> str:
    """Look an order up (fails the first time, as a flaky service does)."""
    flaky_calls.append(order)
    if len(flaky_calls) == 1:
        raise ConnectionError("the order service dropped the connection")
    return f"order {order}: 25.00"


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    use_service(FakeBilling(tmp_path / "billing.db"))
    tools.behaviour["credit"] = "ok"
    flaky_calls.clear()
    async with await Ledger.memory() as ledger:
        yield ledger


async def test_the_nodes_own_retry_replays_the_credit_from_the_ledger(
    ledger: Ledger, tmp_path: Path
) -> None:
    """LangGraph retries a failed node by running all of its tool calls again: the credit
    that already ran in the failed attempt must come back from the ledger, not run twice."""
    run = LangGraphDriver(ledger, node_retry=RetryPolicy(max_attempts=2, initial_interval=0.01))

    def model(told: Sequence[str]) -> Any:
        if not told:
            return [
                {"name": "billing__issue_credit", "args": ARGS, "id": "c1"},
                {"name": "look_up_order", "args": {"order": "7"}, "id": "c2"},
            ]
        return f"done: {' | '.join(told)}"

    run.with_tools([look_up_order], model)
    step = await run.start("t1")
    assert flaky_calls == ["7", "7"], "the node ran twice"
    assert step.answer is not None and "cr_" in step.answer and "order 7" in step.answer
    billing = FakeBilling(tmp_path / "billing.db")
    assert (billing.requests(), billing.effects()) == (1, 1)
