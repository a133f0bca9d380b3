"""`toolledger.testing.Operator` settles calls in process exactly as the operator API does.

On the memory ledger and on Kafka + PostgreSQL: resolve, approve, reject and compensate are the
API's own signed decisions (the projector verifies them), refusals are the API's
`OperatorError`s with their codes, and a tenant-bound operator cannot see another tenant's call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests import api_support as s
from tests.isolated import Isolated, running_stack
from toolledger import Ledger, OperatorError, ToolContext, Toolset, external
from toolledger.runtime.errors import ToolCallAwaitingApproval, ToolCallIndeterminate
from toolledger.testing import Operator

shop = Toolset("shop")
effects: dict[str, list[str]] = {"charged": [], "refunded": []}
slow: dict[str, bool] = {"charge": False}


async def refund(record: Any, context: ToolContext) -> str:
    """Undo a charge (run only when an operator asks)."""
    async with context.sending():
        effects["refunded"].append(record.key)
        return "refunded"


@shop.tool(external(), compensation=refund, timeout=0.2)
async def charge(amount_cents: int, context: ToolContext) -> str:
    """Charge a card."""
    async with context.sending():
        effects["charged"].append(context.idempotency_key)
        if slow["charge"]:
            import asyncio

            await asyncio.Event().wait()  # the charge left; its answer never comes
        return f"ch_{amount_cents}"


@shop.tool(external(approval=True))
async def big_charge(amount_cents: int, context: ToolContext) -> str:
    """A charge an operator approves first."""
    async with context.sending():
        effects["charged"].append(context.idempotency_key)
        return f"ch_{amount_cents}"


@pytest.fixture(autouse=True)
def _reset() -> None:
    effects["charged"].clear()
    effects["refunded"].clear()
    slow["charge"] = False


async def make(ledger: Ledger, tool: Any, call_id: str, tenant: str = "acme") -> Any:
    """Make the call `r1:<call_id>`. An outcome returns on Kafka's ack, and the operator acts
    at once: its reads wait at the read barrier for the record the projector folds."""
    return await ledger.call(
        tool, run_id="r1", tool_call_id=call_id, tenant_id=tenant, arguments={"amount_cents": 5}
    )


class OperatorScenarios:
    ledger: Ledger
    operator: Operator

    async def call(self, tool: Any, call_id: str, tenant: str = "acme") -> Any:
        return await make(self.ledger, tool, call_id, tenant)

    async def test_resolve_settles_an_unknown_call_with_a_signed_decision(self) -> None:
        slow["charge"] = True
        with pytest.raises(ToolCallIndeterminate):
            await self.call(charge, "c1")
        record = await self.operator.resolve(
            "r1:c1", outcome="completed", value="ch_5", reason="found on the card statement"
        )
        assert (record.status, record.settled_by, record.result_json) == (
            "completed",
            "operator",
            '"ch_5"',
        )
        assert record.reason == "found on the card statement"

    async def test_approve_lets_the_call_run_once_and_reject_refuses_it(self) -> None:
        with pytest.raises(ToolCallAwaitingApproval):
            await self.call(big_charge, "c1")
        with pytest.raises(ToolCallAwaitingApproval):
            await self.call(big_charge, "c2")
        await self.operator.approve("r1:c1", reason="customer confirmed")
        rejected = await self.operator.reject("r1:c2", reason="over the limit")
        assert (rejected.status, rejected.not_attempted) == ("failed", True)
        outcome = await self.call(big_charge, "c1")
        assert outcome.value == "ch_5"
        assert effects["charged"] == ["r1:c1"]

    async def test_compensate_runs_the_tools_compensation_once(self) -> None:
        await self.call(charge, "c1")
        done = await self.operator.compensate("r1:c1", reason="customer cancelled")
        assert done.record.status == "compensated"
        assert done.compensation is not None and done.compensation.key == "r1:c1:compensate"
        with pytest.raises(OperatorError) as again:
            await self.operator.compensate("r1:c1", reason="customer cancelled")
        assert again.value.code == "status_mismatch"
        assert effects["refunded"] == ["r1:c1"], "compensation must not run twice"

    async def test_a_refused_decision_is_the_apis_error_with_its_code(self) -> None:
        """Approving a call that needs no approval must be refused as the API refuses it,
        naming what the record is, not silently accepted."""
        await self.call(charge, "c1")
        with pytest.raises(OperatorError) as refused:
            await self.operator.approve("r1:c1", reason="why not")
        assert refused.value.code == "status_mismatch"
        assert "r1:c1" in str(refused.value)

    async def test_a_tenant_bound_operator_does_not_see_another_tenants_call(self) -> None:
        await self.call(charge, "c1", tenant="globex")
        acme = Operator(self.ledger, signing_key=s.SIGNING_KEY, tenant_id="acme")
        with pytest.raises(OperatorError) as refused:
            await acme.resolve("r1:c1", outcome="failed", reason="no")
        assert refused.value.code == "not_found"


class TestMemoryLedger(OperatorScenarios):
    @pytest.fixture(autouse=True)
    async def _ledger(self) -> AsyncIterator[None]:
        async with await Ledger.memory(s.SIGNING_KEY, verdict_timeout=5) as ledger:
            self.ledger = ledger
            async with Operator(ledger, tools=shop) as operator:
                self.operator = operator
                yield

    async def test_it_signs_with_the_memory_ledgers_own_key_by_default(self) -> None:
        async with await Ledger.memory() as ledger:
            with pytest.raises(ToolCallAwaitingApproval):
                await make(ledger, big_charge, "c1")
            record = await Operator(ledger).approve("r1:c1", reason="fine")
            assert record.status == "approved"


class TestKafkaPostgresLedger(OperatorScenarios):
    @pytest.fixture(autouse=True)
    async def _ledger(self, isolated: Isolated) -> AsyncIterator[None]:
        settings = s.api_settings(**isolated.connection())
        async with running_stack(settings) as stack:
            self.ledger = Ledger.from_stack(stack, verdict_timeout=5)
            async with Operator(self.ledger, signing_key=s.SIGNING_KEY, tools=shop) as operator:
                self.operator = operator
                yield
            await self.ledger.close()

    async def test_it_asks_for_a_key_where_the_ledger_keeps_none(self) -> None:
        """A stack ledger holds no private key: the error must say which key to give."""
        with pytest.raises(ValueError, match="TOOLLEDGER_VERIFY_KEYS"):
            Operator(self.ledger)


del OperatorScenarios
