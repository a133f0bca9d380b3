"""Each framework's tool calls take effect once, and an unknown one pauses the run honestly.

Every scenario runs on LangGraph, PydanticAI and the OpenAI Agents SDK (real frameworks, their
offline models; see `drivers.py`), on the memory ledger and on Kafka + PostgreSQL. The fake
billing system, which honours idempotency keys and counts requests and effects, is the judge;
operators act over the real HTTP API, or in process with `toolledger.testing.Operator`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests import api_support as s
from tests.fake_billing import FakeBilling, use_service
from tests.integration.procs import until
from tests.integrations import tools
from tests.integrations.drivers import FRAMEWORKS, Driver, driver
from toolledger import Ledger, OperatorSettings
from toolledger.api import create_app
from toolledger.api.tokens import MemoryTokens
from toolledger.events.records import CallRecord, RunRecord
from toolledger.integrations import AdapterOptions
from toolledger.testing import Operator
from toolledger.wiring.stack import LedgerStack

#: What the frameworks tell a model when a tool raises; none of it may reach our models.
ERROR_TEXTS = ("Please try again", "Please fix your mistakes", "An error occurred", "Error:")


@dataclass
class H:
    ledger: Ledger
    billing: FakeBilling
    api: httpx.AsyncClient
    framework: str
    bearer: str

    @property
    def olivia(self) -> Operator:
        """An operator in process, signed with the key the projector verifies."""
        return Operator(self.ledger, signing_key=s.SIGNING_KEY, tenant_id="acme", name="olivia")

    async def run(self, run_id: str = "t1") -> RunRecord:
        run = await self.ledger.read_run(run_id)
        assert run is not None, f"the ledger has no run {run_id}"
        return run

    async def console_run_state(self, key: str) -> str:
        """The run's state as the console's detail page of `key` shows it, as plain text."""
        page = await self.api.get("/console/signin")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert csrf is not None
        signed = await self.api.post(
            "/console/signin", data={"csrf_token": csrf.group(1), "token": self.bearer}
        )
        assert signed.status_code == 303, signed.text
        detail = await self.api.get("/console/call", params={"key": key})
        assert detail.status_code == 200, detail.text
        rows = re.findall(
            r'<tr><th scope="row">(State|Waiting on)</th><td[^>]*>(.*?)</td>', detail.text
        )
        return "; ".join(f"{name}: {re.sub(r'<[^>]+>', '', value)}" for name, value in rows)

    def driver(self, **kwargs: Any) -> Driver:
        return driver(self.framework, self.ledger, **kwargs)

    async def operator(self, key: str, action: str, **body: Any) -> dict[str, Any]:
        response = await self.api.post(
            f"/v1/tool-executions/{quote(key, safe='')}/{action}",
            json={"reason": "checked the billing console", **body},
        )
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def settled(self, key: str) -> CallRecord:
        """The key's record once projected and settled (outcomes return on Kafka's ack)."""

        async def read() -> CallRecord | None:
            record = await self.ledger.read_call(key)
            return record if record is not None and record.status != "started" else None

        return await until(read, timeout=10, what=f"{key} settled")

    async def resolve_completed(self, key: str) -> None:
        credit = await self.billing.find_credit(key)
        assert credit is not None, f"no credit under {key}"
        await self.operator(key, "resolve", outcome="completed", value=credit.model_dump())


def no_error_text(heard: list[str]) -> bool:
    return not any(text in told for told in heard for text in ERROR_TEXTS)


class FrameworkScenarios:
    @pytest.fixture(autouse=True)
    def _behaviour(self) -> None:
        tools.behaviour["credit"] = "ok"

    async def test_a_call_takes_effect_once_under_its_dotted_name(self, h: H) -> None:
        """The model sees `billing__issue_credit`; the ledger records `billing.issue_credit`."""
        run = h.driver()
        step = await run.start("t1")
        assert step.answer is not None and "cr_" in step.answer
        record = await h.settled("t1:c1")
        assert (record.tool, record.status) == ("billing.issue_credit", "completed")
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)

    async def test_a_colon_in_the_thread_id_is_encoded_never_split(self, h: H) -> None:
        """A thread id `user:42` must not become run `user` with call id `42:c1`."""
        await h.driver().start("user:42")
        record = await h.settled("user%3A42:c1")
        assert (record.run_id, record.tool_call_id) == ("user%3A42", "c1")
        assert await h.ledger.read_call("user:42:c1") is None

    async def test_an_unknown_call_pauses_until_an_operator_settles_it_over_the_api(
        self, h: H
    ) -> None:
        """A credit that timed out after its effect must not reach the model as an error (the
        framework's retry path: it would ask the model to try again, and charge twice)."""
        tools.behaviour["credit"] = "effect_then_timeout"
        run = h.driver(tool="billing__issue_credit_unreconciled")
        step = await run.start("t1")
        assert (step.answer, step.paused, step.reasons) == (
            None,
            ["t1:c1"],
            ["awaiting_reconciliation"],
        )
        assert run.heard == []
        tools.behaviour["credit"] = "ok"
        again = await run.resume("t1")
        assert again.paused == ["t1:c1"], "still unknown: the run pauses again"
        assert run.heard == []
        await h.resolve_completed("t1:c1")
        done = await run.resume("t1")
        credit = await h.billing.find_credit("t1:c1")
        assert credit is not None and done.answer is not None
        assert credit.credit_id in done.answer
        assert no_error_text(run.heard)
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)

    async def test_an_unknown_call_resolved_failed_tells_the_model_it_did_not_happen(
        self, h: H
    ) -> None:
        tools.behaviour["credit"] = "effect_then_timeout"
        run = h.driver(tool="billing__issue_credit_unreconciled")
        await run.start("t1")
        await h.operator("t1:c1", "resolve", outcome="failed")
        done = await run.resume("t1")
        assert done.answer is not None and "did not take effect" in done.answer

    async def test_a_repeated_unknown_charge_is_held_and_answered_by_the_first(self, h: H) -> None:
        """A model told a charge is unknown that charges again under a new call id must not
        charge twice: the repeat is held until the first is settled, then hears its result."""
        tools.behaviour["credit"] = "effect_then_timeout"
        options = AdapterOptions(on_indeterminate="fail")
        run = h.driver(
            tool="billing__issue_credit_unreconciled", retry_unknown=True, options=options
        )
        step = await run.start("t1")
        assert (step.paused, step.reasons) == (["t1:c1"], ["duplicate_intent"])
        assert len(run.heard) == 1 and "unknown" in run.heard[0] and "t1:c1" in run.heard[0]
        assert await h.ledger.read_call("t1:c2") is None, "the repeat was never reserved"
        tools.behaviour["credit"] = "ok"
        await h.resolve_completed("t1:c1")
        done = await run.resume("t1")
        assert done.answer is not None and "repeats the call t1:c1" in done.answer
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)

    async def test_a_repeat_allowed_by_policy_runs(self, h: H) -> None:
        tools.behaviour["credit"] = "effect_then_timeout"
        options = AdapterOptions(on_indeterminate="fail", duplicate_intent="allow")
        run = h.driver(
            tool="billing__issue_credit_unreconciled", retry_unknown=True, options=options
        )
        await run.start("t1")
        assert h.billing.effects() == 2, "allow means allow: the repeat charged again"

    async def test_an_approved_call_runs_once_after_the_operators_decision(self, h: H) -> None:
        run = h.driver(tool="billing__refund_large")
        step = await run.start("t1")
        assert (step.paused, step.reasons) == (["t1:c1"], ["awaiting_approval"])
        assert h.billing.requests() == 0 and run.heard == []
        still = await run.resume("t1")
        assert still.paused == ["t1:c1"], "no decision yet: still waiting"
        await h.operator("t1:c1", "approve")
        done = await run.resume("t1")
        assert done.answer is not None and "cr_" in done.answer
        record = await h.settled("t1:c1")
        assert record.status == "completed"
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)

    async def test_a_resume_before_the_decision_still_reports_awaiting_approval(self, h: H) -> None:
        """Resuming an approval nobody decided yet must say it awaits approval and advise
        approve/reject; the OpenAI adapter said `awaiting_reconciliation` and advised
        `executions resolve`, which the ledger then refused (`status_mismatch`)."""
        first = h.driver(tool="billing__refund_large")
        await first.start("t1")
        elsewhere = h.driver(tool="billing__refund_large")  # a new process, same saved state
        share(first, elsewhere)
        for run in (first, elsewhere):
            still = await run.resume("t1")
            assert (still.paused, still.reasons) == (["t1:c1"], ["awaiting_approval"])
            assert "executions approve t1:c1" in still.details[0], still.details
            assert "resolve" not in still.details[0], still.details
        assert h.billing.requests() == 0 and first.heard == elsewhere.heard == []

    async def test_an_unknown_call_is_the_runs_pause_until_an_operator_settles_it(
        self, h: H
    ) -> None:
        """A framework run paused on an unknown call must say so in the ledger (its record said
        `running`, `waiting_on=None`, so the console showed it running and the resumer never
        fired), and say it goes on once it does."""
        tools.behaviour["credit"] = "effect_then_timeout"
        run = h.driver(tool="billing__issue_credit_unreconciled")
        await run.start("t1")
        paused = await h.run()
        assert (paused.status, paused.waiting_on) == ("awaiting_reconciliation", "t1:c1")
        shown = await h.console_run_state("t1:c1")
        assert "awaiting reconciliation" in shown and "Waiting on: t1:c1" in shown, shown
        tools.behaviour["credit"] = "ok"
        await run.resume("t1")  # still unknown: it pauses again, and the record stays paused
        assert (await h.run()).status == "awaiting_reconciliation"
        credit = await h.billing.find_credit("t1:c1")
        assert credit is not None
        await h.olivia.resolve(
            "t1:c1", outcome="completed", value=credit.model_dump(), reason="in the console"
        )
        done = await run.resume("t1")
        assert done.answer is not None and credit.credit_id in done.answer
        assert no_error_text(run.heard)
        going = await h.run()
        assert (going.status, going.waiting_on) == ("running", None)
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)

    async def test_an_approval_is_the_runs_pause_until_an_operator_decides_it(self, h: H) -> None:
        """A run waiting for an approval must be recorded `awaiting_approval` on that call, and
        going on once an operator approved it; the refund then runs once."""
        run = h.driver(tool="billing__refund_large")
        await run.start("t1")
        paused = await h.run()
        assert (paused.status, paused.waiting_on) == ("awaiting_approval", "t1:c1")
        assert "awaiting approval" in await h.console_run_state("t1:c1")
        await h.olivia.approve("t1:c1", reason="the customer is right")
        done = await run.resume("t1")
        credit = await h.billing.find_credit("t1:c1")
        assert credit is not None and done.answer is not None
        assert credit.credit_id in done.answer
        assert (await h.run()).status == "running"
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)

    async def test_a_rejected_call_never_runs_and_the_model_hears_why(self, h: H) -> None:
        run = h.driver(tool="billing__refund_large")
        await run.start("t1")
        await h.operator("t1:c1", "reject")
        done = await run.resume("t1")
        assert done.answer is not None and "rejected" in done.answer
        assert "checked the billing console" in done.answer
        assert h.billing.requests() == 0

    async def test_two_drivers_resuming_one_thread_make_one_effect(self, h: H) -> None:
        """Two processes resuming the same paused run after the approval must not both run
        the refund. Which one reserves first is a race, with two honest endings for the other:
        it reserved too and lost, so it waits for the winner's outcome and answers with it; or
        it read the call while the winner was running it, which without a reconcile hook is
        "in progress", so its run pauses awaiting reconciliation. Never a second refund."""
        first = h.driver(tool="billing__refund_large")
        await first.start("t1")
        await h.operator("t1:c1", "approve")
        second = h.driver(tool="billing__refund_large")
        share(first, second)
        steps = await asyncio.gather(first.resume("t1"), second.resume("t1"))
        credit = await h.billing.find_credit("t1:c1")
        assert credit is not None
        answered = [step for step in steps if step.answer is not None]
        assert answered, f"no driver ran the refund: {steps}"
        for step in steps:
            if step.answer is not None:
                assert credit.credit_id in step.answer
            else:
                assert (step.paused, step.reasons) == (["t1:c1"], ["awaiting_reconciliation"])
        assert (h.billing.requests(), h.billing.effects()) == (1, 1)


def share(first: Driver, second: Driver) -> None:
    """Give `second` the persistence `first` saved (a second process reading the same store)."""
    second.saved = json.loads(json.dumps(first.saved))
    saver = getattr(first, "saver", None)
    if saver is not None:
        second.saver = saver  # type: ignore[attr-defined]
        second.graph = second._graph()  # type: ignore[attr-defined]


@pytest.fixture(params=FRAMEWORKS)
def framework(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _api(stack: LedgerStack, settings: OperatorSettings) -> tuple[httpx.AsyncClient, str]:
    tokens = MemoryTokens()
    token = (await tokens.create("acme", "alice", "operator", timedelta(hours=1))).token
    app = create_app(stack, settings, tokens=tokens)
    return s.client(app, token), token


class TestMemoryLedger(FrameworkScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, framework: str) -> AsyncIterator[H]:
        billing = use_service(FakeBilling(tmp_path / "billing.db"))
        ledger = await Ledger.memory(s.SIGNING_KEY, verdict_timeout=5)
        settings = s.api_settings()
        api, bearer = await _api(ledger.stack, settings)
        async with api:
            yield H(ledger, billing, api, framework, bearer)
        await ledger.close()


class TestKafkaPostgresLedger(FrameworkScenarios):
    @pytest.fixture
    async def h(
        self,
        tmp_path: Path,
        framework: str,
        pg_dsn: str,
        pg_schema: str,
        kafka_bootstrap: str,
        topic_prefix: str,
    ) -> AsyncIterator[H]:
        billing = use_service(FakeBilling(tmp_path / "billing.db"))
        settings = s.api_settings(
            database_url=pg_dsn,
            kafka_bootstrap=kafka_bootstrap,
            schema_name=pg_schema,
            topic_prefix=topic_prefix + ".",
            partitions=2,
        )
        stack = await LedgerStack.connect(settings, run_projector=True)
        ledger = Ledger.from_stack(stack, verdict_timeout=5)
        api, bearer = await _api(stack, settings)
        async with api:
            yield H(ledger, billing, api, framework, bearer)
        await ledger.close()
        await stack.close()


del FrameworkScenarios
