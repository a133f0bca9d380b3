"""`toolledger resumer` hands a paused run back to its host when its wait is over."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from tests.fake_billing import FakeBilling, use_service
from tests.integration.procs import Proc, Procs, python_child, until
from tests.integration.resume_hook import FAILURES_ENV
from tests.isolated import Isolated, child_env, running_ledger
from tests.run_tools import ARGS, ScriptedModel, runs_billing
from toolledger import Ledger, ProjectorSettings
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
    settings, log, env = _scene(isolated, tmp_path, {})
    billing = use_service(FakeBilling(tmp_path / "billing.db"))
    resumer = ("-m", "toolledger", "resumer", "--app", "tests.integration.resume_hook:resume")
    async with (
        running_ledger(settings, verdict_timeout=10) as ledger,
        python_child(*resumer, env={**os.environ, **env}) as proc,
    ):
        stack = ledger.stack
        await _paused_for_approval(ledger, "r1")
        await _approve(ledger, "r1")
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


async def _paused_for_approval(ledger: Ledger, run_id: str) -> None:
    """Start `run_id`, which pauses at once awaiting approval of its refund call c1."""
    model = ScriptedModel([ToolCallRequest("c1", "runs.refund", ARGS)])
    paused = await AgentRun(
        ledger,
        run_id=run_id,
        tenant_id="acme",
        agent=AgentConfig(name="billing-assistant"),
        tools=runs_billing,
        model=model,
    ).start("refund me")
    assert paused.status == "awaiting_approval"


async def _approve(ledger: Ledger, run_id: str) -> None:
    record = await ledger.read_call(f"{run_id}:c1")
    assert record is not None
    approval = CallApproved(
        key=record.key,
        run_id=run_id,
        tool_call_id="c1",
        tenant_id="acme",
        operator="alice",
        reason="refund is due",
        expected_version=record.version,
    )
    verdict = await ledger.stack.commands.append_and_await(sign(approval, SIGNING_KEY), 10)
    assert verdict.accepted, verdict.detail


def _scene(
    isolated: Isolated, tmp_path: Path, extra: dict[str, str]
) -> tuple[ProjectorSettings, Path, dict[str, str]]:
    """The test's settings, its resume log, and a resumer's environment (fast back-off)."""
    settings = isolated.settings(ProjectorSettings, verify_keys=SIGNING_KEY.verify_keys())
    use_service(FakeBilling(tmp_path / "billing.db"))
    log = tmp_path / "resumed.log"
    env = {
        "PYTHONPATH": str(ROOT),
        **child_env(settings),
        "BILLING_DB": str(tmp_path / "billing.db"),
        "RESUME_LOG": str(log),
        "TOOLLEDGER_RESUME_BACKOFF_S": "0.2",
        **extra,
    }
    return settings, log, env


def _resumer(procs: Procs, name: str, env: dict[str, str]) -> Proc:
    app = "tests.integration.resume_hook:resume"
    args = ("resumer", "--app", app, "--session-timeout", "6")
    return procs.python(name, "toolledger", *args, env=env)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_resume_hook_that_raises_is_retried_and_the_resumer_goes_on(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A hook that raised once used to crash the resumer's faust agent: that run stayed
    `awaiting_approval` with its call decided, and no later run was resumed either. The hook
    must be called again after a back-off, logged with the run id, and other runs must still
    be resumed."""
    settings, log, env = _scene(isolated, tmp_path, {FAILURES_ENV: "3"})
    procs = Procs(tmp_path)
    try:
        async with running_ledger(settings, verdict_timeout=10) as ledger:
            resumer = _resumer(procs, "resumer", env)  # a new group reads facts from the start
            await _paused_for_approval(ledger, "r1")
            await _approve(ledger, "r1")
            await until(lambda: _lines(log), timeout=45, what="r1 resumed after a failed try")
            await _paused_for_approval(ledger, "r2")
            await _approve(ledger, "r2")
            await until(lambda: len(_lines(log)) == 2, timeout=30, what="r2 resumed as well")
            assert _lines(log) == ["r1 completed completed", "r2 completed completed"]
            assert _lines(Path(f"{log}.calls")) == ["r1 called"] * 4 + ["r2 called"]
            out = resumer.output()
            assert "resume hook failed for run r1 (waiting on r1:c1), attempt 3 of 5" in out
            assert "RuntimeError: the host's model is unreachable (call 1)" in out
            assert "Crashed" not in out
            resumer.signal(signal.SIGTERM)  # the hook closed its ledger: nothing left open
            assert await resumer.wait_exit(timeout=30) == 0
            assert "Unclosed" not in resumer.output()
    finally:
        procs.close()


async def test_a_hook_that_keeps_failing_marks_the_run_and_a_restarted_resumer_resumes_it(
    isolated: Isolated, tmp_path: Path
) -> None:
    """After TOOLLEDGER_RESUME_MAX_ATTEMPTS failures the run must say why it did not go on,
    in the ledger (so the API, the console and a replay see it); and a resumer started after
    the hook was fixed must resume it, though no new fact names the run."""
    settings, log, env = _scene(isolated, tmp_path, {"TOOLLEDGER_RESUME_MAX_ATTEMPTS": "3"})
    procs = Procs(tmp_path)
    try:
        async with running_ledger(settings, verdict_timeout=10) as ledger:
            broken = _resumer(procs, "broken", {**env, FAILURES_ENV: "always"})
            await _paused_for_approval(ledger, "r1")
            await _approve(ledger, "r1")

            async def marked() -> str | None:
                run = await ledger.stack.store.get_run("r1")
                return None if run is None else run.resume_error

            error = await until(marked, timeout=45, what="r1 marked with its hook's error")
            assert "failed 3 times" in error and "model is unreachable" in error
            assert _lines(Path(f"{log}.calls")) == ["r1 called"] * 3
            run = await ledger.stack.store.get_run("r1")
            assert run is not None and run.status == "awaiting_approval"
            broken.signal(signal.SIGTERM)
            assert await broken.wait_exit(timeout=30) == 0

            fixed = _resumer(procs, "fixed", env)
            await until(lambda: _lines(log), timeout=45, what="the restarted resumer's resume")
            assert _lines(log) == ["r1 completed completed"]

            async def cleared() -> bool:
                run = await ledger.stack.store.get_run("r1")
                return run is not None and run.status == "completed" and not run.resume_error

            await until(cleared, timeout=30, what="r1 completed, its mark cleared")
            assert fixed.alive()
    finally:
        procs.close()
