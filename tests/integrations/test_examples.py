"""Each framework example runs as documented: the unknown refund pauses the run, an operator
resolves it (`testing.Operator`), the resumed run tells the customer, and one payout is made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import api_support as s
from tests.integration.procs import Procs, toolledger_env
from tests.isolated import Isolated, running_stack
from toolledger.testing import Operator

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "example", ["langgraph_refund", "pydantic_ai_refund", "openai_agents_refund"]
)
def test_the_example_pauses_is_settled_and_pays_once(example: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    shown = subprocess.run(
        [sys.executable, "-m", f"toolledger.examples.integrations.{example}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "paused: order-7:call_1 awaiting_reconciliation (the model heard nothing)"
    assert lines[1] == "operator: resolved order-7:call_1 -> completed"
    assert lines[2].startswith("penny: Your refund went through:") and "po_1" in lines[2]
    assert lines[3] == "payouts made: 1"


async def test_the_pydantic_ai_example_resumes_in_another_process(
    isolated: Isolated, procs: Procs, tmp_path: Path
) -> None:
    """The example's docstring promised a resume in another process and showed none: here one
    process pauses and saves, a second one resumed too early is told which call to settle and
    how (toolledger's error, not pydantic-ai's `UserError`), and a third one, after the
    operator, finishes the run with the truth. One payout."""
    settings = s.api_settings(**isolated.connection())
    saved = tmp_path / "saved.json"
    env = toolledger_env(settings)
    example = "toolledger.examples.integrations.pydantic_ai_refund"
    async with running_stack(settings) as stack:
        first = procs.python("start", example, "start", str(saved), env=env)
        assert await first.wait_exit(timeout=120) == 0, first.output()
        shown = first.output()
        assert "paused: order-7:call_1 awaiting_reconciliation" in shown
        run = await stack.store.get_run("order-7")
        assert run is not None and (run.status, run.waiting_on) == (
            "awaiting_reconciliation",
            "order-7:call_1",
        )
        early = procs.python("early", example, "resume", str(saved), env=env)
        assert await early.wait_exit(timeout=120) != 0
        told = early.output()
        assert "RunStillPaused: run order-7 cannot go on yet" in told, told
        assert "toolledger executions resolve order-7:call_1" in told and "UserError" not in told
        found = re.search(r"provider: (\{.*\}) under order-7:call_1", shown)
        assert found is not None, shown
        payout = json.loads(found.group(1))
        await Operator(stack, signing_key=s.SIGNING_KEY).resolve(
            "order-7:call_1", outcome="completed", value=payout, reason="found in the dashboard"
        )
        last = procs.python("resume", example, "resume", str(saved), env=env)
        assert await last.wait_exit(timeout=120) == 0, last.output()
        assert "penny: Your refund went through:" in last.output()
        assert payout["payout_id"] in last.output()
        assert shown.count("provider:") == 1, "one payout"
        run = await stack.store.get_run("order-7")
        assert run is not None and run.status == "running"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    procs = Procs(tmp_path)
    yield procs
    procs.close()
