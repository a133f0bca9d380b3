"""Runs: checkpoints with fencing, pause on unknown, approvals and the duplicate-intent guard.

Every scenario runs on the memory ledger and on Kafka + PostgreSQL. The fake billing system
(idempotency keys honoured, effects counted) judges "one charge".
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests import run_tools
from tests.fake_billing import FakeBilling, use_service
from tests.isolated import Isolated, running_ledger
from tests.run_tools import ARGS, ScriptedModel, charge_once, runs_billing
from toolledger import Ledger, ProjectorSettings, RunSuperseded
from toolledger.events.models import CallApproved, CallCompleted, CallRejected, CallResolved
from toolledger.events.signing import SigningKey, sign
from toolledger.runtime.agents import AgentConfig, ToolPolicy
from toolledger.runtime.runs import AgentRun, FinalAnswer, ToolCallRequest

KEY_ID = "ops-1"
SIGNING_KEY = SigningKey.from_seed(KEY_ID, b"run-tests-operator-signing-key32")


@dataclass
class H:
    ledger: Ledger
    billing: FakeBilling

    def run(self, model: ScriptedModel, run_id: str = "r1", **policy: Any) -> AgentRun:
        agent = AgentConfig(name="billing-assistant", tool_policy=ToolPolicy(**policy))
        return AgentRun(
            self.ledger,
            run_id=run_id,
            tenant_id="acme",
            agent=agent,
            tools=runs_billing,
            model=model,
        )

    async def resolve(
        self, key: str, outcome: Literal["completed", "failed"], value: Any = None
    ) -> None:
        record = await self.ledger.read_call(key)
        assert record is not None
        event = CallResolved(
            key=key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant_id=record.tenant_id,
            operator="alice",
            reason="checked the billing console",
            expected_version=record.version,
            outcome=outcome,
            value_json=None if value is None else json.dumps(value),
        )
        verdict = await self.ledger.stack.commands.append_and_await(sign(event, SIGNING_KEY), 10)
        assert verdict.accepted, verdict.detail

    async def reconciler_finds(self, key: str) -> None:
        """What the reconciler appends when its hook finds the effect by key."""
        record = await self.ledger.read_call(key)
        assert record is not None
        credit = await self.billing.find_credit(key)
        assert credit is not None
        verdict = await self.ledger.stack.commands.append_and_await(
            CallCompleted(
                key=key,
                run_id=record.run_id,
                tool_call_id=record.tool_call_id,
                tenant_id=record.tenant_id,
                reservation_id=record.reservation_id,
                result_json=credit.model_dump_json(),
                result_reference=credit.credit_id,
                source="reconcile",
                expected_version=record.version,
            ),
            10,
        )
        assert verdict.accepted, verdict.detail

    async def decide_approval(self, key: str, approve: bool) -> None:
        record = await self.ledger.read_call(key)
        assert record is not None
        kind = CallApproved if approve else CallRejected
        event = kind(
            key=key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant_id=record.tenant_id,
            operator="alice",
            reason="looks right" if approve else "not this one",
            expected_version=record.version,
        )
        verdict = await self.ledger.stack.commands.append_and_await(sign(event, SIGNING_KEY), 10)
        assert verdict.accepted, verdict.detail

    async def resumable(self) -> list[str]:
        return [r.run_id async for r in self.ledger.resumable_runs(follow=False)]


class RunScenarios:
    @pytest.fixture(autouse=True)
    def _behaviour(self) -> None:
        run_tools.behaviour["charge"] = "ok"

    async def test_a_run_checkpoints_before_its_tools_and_finishes(self, h: H) -> None:
        model = ScriptedModel(*charge_once())
        result = await h.run(model).start("refund my order")
        assert (result.status, result.answer) == ("completed", "charged")
        run = await h.ledger.stack.store.get_run("r1")
        assert run is not None and run.status == "completed"
        history = await h.ledger.stack.store.history("r1")
        types = [e.event_type for e in history]
        assert types == ["run_started", "run_checkpointed", "run_checkpointed", "run_finished"]
        assert json.loads(history[2].event_json)["tool_call_ids"] == ["c1"]
        assert h.billing.effects() == 1
        assert model.last_tool_message()["status"] == "completed"

    async def test_on_indeterminate_fail_fails_the_run(self, h: H) -> None:
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel(*charge_once())
        result = await h.run(model, on_indeterminate="fail").start("charge")
        assert result.status == "failed"
        assert "indeterminate" in result.detail
        assert len(model.seen) == 1, "the model must not be asked again after the run failed"

    async def test_on_indeterminate_fail_with_return_to_model_tells_the_model_it_is_unknown(
        self, h: H
    ) -> None:
        """The model hears the honest answer, "unknown" (as every framework adapter says it),
        never "failed": a model told "failed" retries, and the charge may be made twice."""
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel([ToolCallRequest("c1", "runs.charge", ARGS)], FinalAnswer("sorry"))
        run = h.run(model, on_indeterminate="fail", on_error="return_to_model")
        result = await run.start("charge")
        assert result.status == "completed"
        told = model.last_tool_message()
        assert told["status"] == "indeterminate"
        assert "nobody knows whether it took effect" in json.loads(told["content"])

    async def test_on_indeterminate_pause_waits_and_the_model_hears_the_real_result(
        self, h: H
    ) -> None:
        """The double-charge scenario with pause + hold: exactly one charge; the run resumes
        after the reconciler finds it; the model hears the real result, never "failed"."""
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel(*charge_once("c1"), "retry-if-failed")
        result = await h.run(model, on_indeterminate="pause").start("charge")
        assert (result.status, result.waiting_on) == ("awaiting_reconciliation", "r1:c1")
        assert await h.resumable() == []
        await h.reconciler_finds("r1:c1")
        assert await h.resumable() == ["r1"]
        run_tools.behaviour["charge"] = "ok"
        resumed = await h.run(model, on_indeterminate="pause").resume()
        assert resumed.status == "completed"
        told = model.last_tool_message()
        assert told["status"] == "completed"
        assert json.loads(told["content"])["amount_cents"] == 2500
        assert h.billing.effects() == 1

    async def test_without_the_guard_a_retry_with_a_new_call_id_charges_twice(self, h: H) -> None:
        """fail + return_to_model + allow: the model hears "failed" and retries with a new call
        id and the same arguments. Two real charges: this is what the guard is for. The second
        reservation carries a warning into the history."""
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel(_charge("c1"), "retry-if-failed", FinalAnswer("done"))
        first = h.run(
            model, on_indeterminate="fail", on_error="return_to_model", duplicate_intent="allow"
        )
        result = await _start_then_behave(first, "ok")
        assert result.status == "completed"
        assert h.billing.effects() == 2
        history = await h.ledger.stack.store.history("r1:c1-retry")
        assert "duplicate intent of r1:c1" in history[0].detail

    async def test_the_guard_holds_a_retry_until_the_first_call_is_settled(self, h: H) -> None:
        """fail + return_to_model + hold: the retry waits for the unknown first call; once the
        reconciler finds it, the retry gets the first call's result and nothing is charged
        twice."""
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel(_charge("c1"), "retry-if-failed", FinalAnswer("done"))
        run = h.run(
            model, on_indeterminate="fail", on_error="return_to_model", duplicate_intent="hold"
        )
        result = await run.start("charge")
        assert (result.status, result.waiting_on) == ("duplicate_intent", "r1:c1")
        await h.reconciler_finds("r1:c1")
        assert await h.resumable() == ["r1"]
        run_tools.behaviour["charge"] = "ok"
        again = h.run(
            model, on_indeterminate="fail", on_error="return_to_model", duplicate_intent="hold"
        )
        resumed = await again.resume()
        assert resumed.status == "completed"
        told = model.last_tool_message()
        assert (told["status"], told.get("same_as")) == ("completed", "r1:c1")
        assert h.billing.effects() == 1

    async def test_an_operator_failure_is_what_the_model_hears_after_a_pause(self, h: H) -> None:
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel(_charge("c1"), FinalAnswer("sorry"))
        await h.run(model, on_indeterminate="pause", on_error="return_to_model").start("charge")
        await h.resolve("r1:c1", "failed")
        resumed = await h.run(model, on_indeterminate="pause", on_error="return_to_model").resume()
        assert resumed.status == "completed"
        told = model.last_tool_message()
        assert told["status"] == "failed" and "did not take effect" in told["content"]

    async def test_a_contested_call_pauses_the_run_until_an_operator_decides_again(
        self, h: H
    ) -> None:
        """An operator said failed, then the charge's late completed arrived: the model must
        not hear "failed" (it would retry and charge twice); the run waits for a new decision."""
        run_tools.behaviour["charge"] = "effect_then_timeout"
        model = ScriptedModel(_charge("c1"), "retry-if-failed", FinalAnswer("done"))
        await h.run(model, on_indeterminate="pause").start("charge")
        await h.resolve("r1:c1", "failed")
        record = await h.ledger.read_call("r1:c1")
        assert record is not None
        late = await h.ledger.stack.commands.append_and_await(
            CallCompleted(
                key="r1:c1",
                run_id="r1",
                tool_call_id="c1",
                tenant_id="acme",
                reservation_id=record.reservation_id,
                result_json='{"late": true}',
            ),
            10,
        )
        assert late.call is not None and late.call.contested
        assert await h.resumable() == []
        paused = await h.run(model, on_indeterminate="pause").resume()
        assert (paused.status, paused.waiting_on) == ("awaiting_reconciliation", "r1:c1")
        await h.resolve("r1:c1", "completed", {"credit_id": "cr_late"})
        assert await h.resumable() == ["r1"]
        resumed = await h.run(model, on_indeterminate="pause").resume()
        assert resumed.status == "completed"
        assert model.last_tool_message()["status"] == "completed"
        assert h.billing.effects() == 1

    async def test_an_approval_gate_pauses_the_run_until_an_operator_approves(self, h: H) -> None:
        model = ScriptedModel([ToolCallRequest("c1", "runs.refund", ARGS)], FinalAnswer("refunded"))
        result = await h.run(model).start("refund")
        assert (result.status, result.waiting_on) == ("awaiting_approval", "r1:c1")
        assert h.billing.effects() == 0
        assert await h.resumable() == []
        await h.decide_approval("r1:c1", approve=True)
        assert await h.resumable() == ["r1"]
        resumed = await h.run(model).resume()
        assert resumed.status == "completed"
        assert h.billing.effects() == 1

    async def test_a_rejected_approval_is_not_attempted_and_the_model_hears_it(self, h: H) -> None:
        model = ScriptedModel([ToolCallRequest("c1", "runs.refund", ARGS)], FinalAnswer("ok"))
        await h.run(model, on_error="return_to_model").start("refund")
        await h.decide_approval("r1:c1", approve=False)
        resumed = await h.run(model, on_error="return_to_model").resume()
        assert resumed.status == "completed"
        told = model.last_tool_message()
        assert told["status"] == "failed" and "not this one" in told["content"]
        record = await h.ledger.read_call("r1:c1")
        assert record is not None and record.not_attempted
        assert h.billing.effects() == 0

    async def test_of_two_drivers_the_one_without_the_latest_checkpoint_stands_down(
        self, h: H
    ) -> None:
        """Two drivers load the same checkpoint; each asks its own model (different call ids).
        Only the first to checkpoint runs its step; the other gets RunSuperseded."""
        model = ScriptedModel([ToolCallRequest("a1", "runs.charge", ARGS)], FinalAnswer("a"))
        first = h.run(model)
        paused = await first.start("go")  # completes: a1 charged
        assert paused.status == "completed"
        # a fresh run for the race
        one = h.run(ScriptedModel([ToolCallRequest("x1", "runs.charge", ARGS)]), run_id="r2")
        two = h.run(ScriptedModel([ToolCallRequest("y1", "runs.charge", ARGS)]), run_id="r2")
        await one._append(  # start r2 and its first checkpoint, as `start` would
            _run_started("r2", one)
        )
        one.transcript = [{"role": "user", "content": "go"}]
        await one._checkpoint([])
        two.version, two.transcript = one.version, list(one.transcript)
        one.model.turns.append(FinalAnswer("one"))  # type: ignore[attr-defined]
        winner = await one._drive()
        assert winner.status == "completed"
        with pytest.raises(RunSuperseded):
            await two._drive()
        assert h.billing.effects("r2:x1") == 1
        assert h.billing.effects("r2:y1") == 0

    async def test_a_run_that_crashed_mid_step_recovers_without_rerunning_a_call(
        self, h: H
    ) -> None:
        """The driver made the call and died before the result reached its transcript; a new
        driver resumes from the checkpoint and the call comes back from the ledger."""
        model = ScriptedModel(*charge_once("c1"))
        run = h.run(model)
        original = run._make

        async def crash_after_call(request: ToolCallRequest) -> Any:
            await original(request)
            raise KeyboardInterrupt("process died")

        run._make = crash_after_call  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            await run.start("charge")
        assert h.billing.requests("r1:c1") == 1
        resumed = await h.run(model).resume()
        assert resumed.status == "completed"
        assert h.billing.requests("r1:c1") == 1, "the call ran again"
        assert model.last_tool_message()["status"] == "completed"


def _charge(call_id: str) -> list[ToolCallRequest]:
    return [ToolCallRequest(call_id, "runs.charge", ARGS)]


def _run_started(run_id: str, run: AgentRun) -> Any:
    from toolledger.events.models import RunStarted

    return RunStarted(**run._envelope(), agent="billing-assistant")


async def _start_then_behave(run: AgentRun, after_first: str) -> Any:
    """Start the run; the first charge misbehaves, the retry behaves as `after_first`."""
    original = run.ledger.call

    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await original(*args, **kwargs)
        finally:
            run_tools.behaviour["charge"] = after_first

    run.ledger.call = call  # type: ignore[method-assign]
    try:
        return await run.start("charge")
    finally:
        run.ledger.call = original  # type: ignore[method-assign]


class TestMemoryRuns(RunScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[H]:
        billing = use_service(FakeBilling(tmp_path / "billing.db"))
        ledger = await Ledger.memory(SIGNING_KEY, verdict_timeout=5)
        yield H(ledger, billing)
        await ledger.close()


class TestKafkaPostgresRuns(RunScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[H]:
        billing = use_service(FakeBilling(tmp_path / "billing.db"))
        settings = isolated.settings(ProjectorSettings, verify_keys=SIGNING_KEY.verify_keys())
        async with running_ledger(settings, verdict_timeout=5) as ledger:
            yield H(ledger, billing)


del RunScenarios
