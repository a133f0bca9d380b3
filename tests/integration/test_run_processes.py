"""Runs across real OS processes (Kafka + PostgreSQL): a driver SIGKILLed mid-step, and two
processes driving one run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import builders as b
from tests.fake_billing import FakeBilling, use_service
from tests.integration.procs import until
from tests.isolated import Isolated, child_env, running_ledger
from tests.run_tools import ARGS, ScriptedModel, runs_billing
from toolledger import Ledger
from toolledger import ProjectorSettings as Settings
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.runs import AgentRun, FinalAnswer, ToolCallRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(isolated: Isolated) -> Settings:
    return isolated.settings(Settings, verify_keys=b.KEYS)


@pytest.fixture
async def ledger(settings: Settings) -> AsyncIterator[Ledger]:
    async with running_ledger(settings, verdict_timeout=10) as ledger:
        yield ledger


async def _worker(settings: Settings, tmp: Path, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **child_env(settings)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.run_worker",
        *args,
        "--service",
        str(tmp / "billing.db"),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _until(path: Path, proc: asyncio.subprocess.Process, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not path.exists():
            if proc.returncode is not None:
                _, err = await proc.communicate()
                raise AssertionError(f"worker exited early: {err.decode()[-2000:]}")
            await asyncio.sleep(0.01)


def _agent() -> AgentConfig:
    return AgentConfig(name="billing-assistant")


async def test_a_run_sigkilled_mid_step_recovers_on_another_process_without_rerunning_the_call(
    ledger: Ledger, settings: Settings, tmp_path: Path
) -> None:
    """The driver process dies after the charge went through and before the ledger heard of
    it. Another process resumes the run from its checkpoint: the call comes back through its
    reconcile hook, the model hears the real result, and the customer is charged once."""
    billing = use_service(FakeBilling(tmp_path / "billing.db"))
    ready = tmp_path / "crash.ready"
    proc = await _worker(settings, tmp_path, "crash", "--run", "r1", "--ready", str(ready))
    try:
        await _until(ready, proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == -signal.SIGKILL
    # The worker's reservation verdict may have come from the leader's memory, before the
    # projection committed it (the leader fast path): this process reads it once committed.
    record = await until(
        lambda: ledger.read_call("r1:c1"), timeout=10, what="the killed worker's reservation"
    )
    assert record.status == "started"
    model = ScriptedModel(FinalAnswer("charged once"))
    run = AgentRun(
        ledger, run_id="r1", tenant_id="acme", agent=_agent(), tools=runs_billing, model=model
    )
    result = await run.resume()
    assert (result.status, result.answer) == ("completed", "charged once")
    told = model.last_tool_message()
    assert told["status"] == "completed" and json.loads(told["content"])["amount_cents"] == 2500
    assert billing.requests("r1:c1") == 1
    assert billing.effects() == 1


async def test_two_processes_driving_one_run_one_stands_down_and_each_step_has_one_effect(
    ledger: Ledger, settings: Settings, tmp_path: Path
) -> None:
    """Two workers load the same checkpoint and resume at the same instant, each with its own
    model (different call ids). Only one may drive: the other stands down with RunSuperseded
    and its call never reaches the billing system."""
    billing = use_service(FakeBilling(tmp_path / "billing.db"))
    first = ScriptedModel([ToolCallRequest("c1", "runs.refund", ARGS)], FinalAnswer("x"))
    paused = await AgentRun(
        ledger, run_id="r1", tenant_id="acme", agent=_agent(), tools=runs_billing, model=first
    ).start("refund me")
    assert paused.status == "awaiting_approval"
    go = tmp_path / "go"
    workers = []
    for name in ("a", "b"):
        ready = tmp_path / f"{name}.ready"
        proc = await _worker(
            settings,
            tmp_path,
            "resume",
            "--run",
            "r1",
            "--ready",
            str(ready),
            "--go",
            str(go),
            "--call",
            f"{name}1",
        )
        workers.append((proc, ready))
    try:
        for proc, ready in workers:
            await _until(ready, proc)
        go.write_text("go")
        outputs = []
        for proc, _ in workers:
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err.decode()[-2000:]
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for proc, _ in workers:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    statuses = sorted(o["status"] for o in outputs)
    # the refund still awaits approval, so the winner pauses again; the loser stood down
    assert statuses == ["awaiting_approval", "superseded"], outputs
    assert billing.effects() == 0
    run = await ledger.stack.store.get_run("r1")
    assert run is not None and run.status == "awaiting_approval"
