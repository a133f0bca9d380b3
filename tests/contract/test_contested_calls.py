"""A late outcome that contradicts an operator never allows a silent rerun (issue 15, item 4).

Found by trying it: a write timed out after sending (indeterminate), an operator resolved it
`failed`, the tool's `completed` then arrived late and was rightly rejected, and a fresh
`ledger.call` of the same key reserved again and ran the tool a second time. The call is now
*contested*: `ledger.call` raises `ToolCallContested` (naming the key, the decision and the
evidence) until an operator decides again. Every scenario runs on the memory ledger and on
Kafka + PostgreSQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.runtime_harness import (
    Harness,
    calls,
    credit_then_hang,
    kafka_postgres_harness,
    late_completed,
    memory_harness,
    reset,
)
from tests.isolated import Isolated
from toolledger import ToolCallIndeterminate
from toolledger.events.models import CallResolved
from toolledger.port import CallQuery
from toolledger.runtime.errors import ToolCallContested


@pytest.fixture(autouse=True)
def _reset() -> None:
    reset()


class ContestedScenarios:
    async def _operator_failed_then_late_completed(self, h: Harness) -> None:
        with pytest.raises(ToolCallIndeterminate):
            await h.call(credit_then_hang)
        record = await h.record("r1:c1", "indeterminate")
        assert (await h.operator(CallResolved, record, outcome="failed")).accepted
        await late_completed(h)

    async def test_a_contested_call_is_not_run_again_and_the_error_names_what_happened(
        self, h: Harness
    ) -> None:
        """The ledger held proof that the first attempt took effect and ran the tool again."""
        await self._operator_failed_then_late_completed(h)
        record = await h.record("r1:c1")
        assert (record.status, record.contested) == ("failed", True)
        with pytest.raises(ToolCallContested) as raised:
            await h.call(credit_then_hang)
        message = str(raised.value)
        assert "r1:c1" in message and "operator alice settled it failed" in message
        assert "checked the billing console" in message and "late call_completed" in message
        assert f"--expected-version {record.version}" in message
        assert calls["credit_then_hang"] == 1 and h.service.effects("r1:c1") == 1
        assert isinstance(raised.value, ToolCallIndeterminate)

    async def test_an_operators_new_decision_settles_the_contest(self, h: Harness) -> None:
        """After the operator decides again the call answers with that decision."""
        await self._operator_failed_then_late_completed(h)
        record = await h.record("r1:c1")
        verdict = await h.operator(
            CallResolved, record, outcome="completed", value_json='{"credit_id":"cr_late"}'
        )
        assert verdict.accepted, verdict.detail
        settled = await h.record("r1:c1", "completed")
        assert not settled.contested
        outcome = await h.call(credit_then_hang)
        assert outcome.status == "completed" and outcome.replayed
        assert calls["credit_then_hang"] == 1

    async def test_the_queue_lists_contested_calls(self, h: Harness) -> None:
        """An operator must be able to find the calls that wait for a second decision."""
        await self._operator_failed_then_late_completed(h)
        listed = await h.stack.store.list_calls(CallQuery(tenant_id="acme", contested=True))
        assert [c.key for c in listed] == ["r1:c1"]
        assert await h.stack.store.list_calls(CallQuery(tenant_id="acme", contested=False)) == []


class TestMemoryContested(ContestedScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[Harness]:
        async with memory_harness(tmp_path) as h:
            yield h


class TestKafkaPostgresContested(ContestedScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
        async with kafka_postgres_harness(tmp_path, isolated) as h:
            yield h


del ContestedScenarios
