"""`toolledger resumer` hands a paused run back to its host when its wait is over."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.fake_billing import FakeBilling, use_service
from tests.integration.procs import python_child, until
from tests.isolated import Isolated, child_env, running_ledger
from tests.run_tools import ARGS, ScriptedModel, runs_billing
from toolledger import ProjectorSettings
from toolledger.events.models import CallApproved
from toolledger.events.signing import SigningKey, sign
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.runs import AgentRun, ToolCallRequest

ROOT = Path(__file__).resolve().parents[2]
SIGNING_KEY = SigningKey.from_seed("ops-1", b"resumer-test-operator-signing-k1")


async def test_an_approved_call_resumes_its_paused_run_through_the_resumer(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A run paused awaiting approval must go on by itself once an operator approves: the
    resumer sees the decision in the facts and calls the host, which resumes the run; the
    refund is made once and the model hears its result."""
    settings = isolated.settings(ProjectorSettings, verify_keys=SIGNING_KEY.verify_keys())
    billing = use_service(FakeBilling(tmp_path / "billing.db"))
    log = tmp_path / "resumed.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        **child_env(settings),
        "BILLING_DB": str(tmp_path / "billing.db"),
        "RESUME_LOG": str(log),
    }
    resumer = ("-m", "toolledger", "resumer", "--app", "tests.integration.resume_hook:resume")
    async with (
        running_ledger(settings, verdict_timeout=10) as ledger,
        python_child(*resumer, env=env) as proc,
    ):
        stack = ledger.stack
        model = ScriptedModel([ToolCallRequest("c1", "runs.refund", ARGS)])
        paused = await AgentRun(
            ledger,
            run_id="r1",
            tenant_id="acme",
            agent=AgentConfig(name="billing-assistant"),
            tools=runs_billing,
            model=model,
        ).start("refund me")
        assert paused.status == "awaiting_approval"
        record = await ledger.read_call("r1:c1")
        assert record is not None
        approval = CallApproved(
            key=record.key,
            run_id="r1",
            tool_call_id="c1",
            tenant_id="acme",
            operator="alice",
            reason="refund is due",
            expected_version=record.version,
        )
        verdict = await stack.commands.append_and_await(sign(approval, SIGNING_KEY), 10)
        assert verdict.accepted
        async with asyncio.timeout(45):
            while not (log.exists() and log.read_text().strip()):
                if proc.returncode is not None:
                    _, err = await proc.communicate()
                    raise AssertionError(err.decode()[-3000:])
                await asyncio.sleep(0.05)
        assert log.read_text().split() == ["r1", "completed", "completed"]
        assert billing.effects() == 1

        async def completed() -> bool:
            # The resumer's process heard its leader answer; PostgreSQL has it a batch later.
            run = await stack.store.get_run("r1")
            return run is not None and run.status == "completed"

        await until(completed, timeout=30, what="the resumed run's completion committed")
