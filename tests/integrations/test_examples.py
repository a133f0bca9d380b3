"""Each framework example runs as documented: the unknown refund pauses the run, an operator
resolves it (`testing.Operator`), the resumed run tells the customer, and one payout is made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "example", ["langgraph_refund", "pydantic_ai_refund", "openai_agents_refund"]
)
def test_the_example_pauses_is_settled_and_pays_once(example: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    shown = subprocess.run(
        [sys.executable, "-m", f"examples.integrations.{example}"],
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
