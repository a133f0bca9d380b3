"""The MCP refund example must run offline and tell the story its docstring tells."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integrations.mcp_support import ROOT


def test_the_mcp_refund_example_pays_each_customer_once() -> None:
    """A resent refund comes back recorded, an unknown one is held and then answered by the
    operator's resolution: one payout per customer, with no service running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    shown = subprocess.run(
        [sys.executable, "-m", "toolledger.examples.integrations.mcp_refund"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = [line.strip() for line in shown.stdout.splitlines()]
    assert lines[0].startswith("1. penny__pay_refund (call refund-1) -> completed")
    assert lines[2] == lines[0].removeprefix("1. ")
    assert (
        "(call refund-2) -> indeterminate: The outcome of penny__pay_refund is unknown" in lines[3]
    )
    assert "(call refund-3) -> held" in lines[5]
    assert "operator: resolved penny-run:refund-2 -> completed" in lines
    assert '(call refund-2) -> completed: {"amount_cents":2500' in lines[7]
    assert "(call refund-3) -> completed: This repeats the call penny-run:refund-2" in lines[8]
    assert lines[-1] == "payouts made: 2 ({'cust-1': 1, 'cust-2': 1})"
