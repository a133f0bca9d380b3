"""The scripted model of a drill run: M charges, one per step, then a final answer.

Every answer is a function of the transcript alone, so a run resumed on another process gets
the same next step it would have got on the first:

- step `k` is the lowest step without a completed tool result;
- its first call is `s<k>`; after the model heard that a call of step `k` failed (a call whose
  runtime died before the request reached billing, settled `failed` on evidence), it retries
  with `s<k>r<n>`, a new call id, as a real model would;
- with every step completed it answers with the credit ids it was told.

Step `k` uses `drill.transfer` (no reconcile hook: an operator settles its unknowns) for one
step in four, `drill.refund` (over HTTP, settled by resending) for another, `drill.charge`
otherwise. The arguments carry the memo `<run>/s<k>`, so billing
can tell two credits of one step apart even under different keys.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

from toolledger.drill.killpoints import KillPoints
from toolledger.runtime.agents import AgentConfig, ToolPolicy
from toolledger.runtime.runs import FinalAnswer, ModelTurn, ToolCallRequest, Transcript

TENANT = "drill"
#: Unknown calls pause the run until they are settled; failures go back to the model.
AGENT = AgentConfig(
    name="drill-agent",
    tool_policy=ToolPolicy(on_indeterminate="pause", on_error="return_to_model"),
)
_CALL_ID = re.compile(r"^s(\d+)(?:r(\d+))?$")


def prompt(run_id: str, calls: int) -> str:
    return f"charge account {account(run_id)} {calls} times, one step at a time"


def account(run_id: str) -> str:
    return f"acct-{run_id}"


def step_of(tool_call_id: str) -> int | None:
    found = _CALL_ID.match(tool_call_id)
    return None if found is None else int(found.group(1))


def memo(run_id: str, step: int) -> str:
    return f"{run_id}/s{step}"


def tool_for(run_id: str, step: int) -> str:
    turn = (sum(map(ord, run_id)) + step) % 4
    return "drill.transfer" if turn == 3 else "drill.refund" if turn == 1 else "drill.charge"


class ScriptedModel:
    """The model of one run; `kill_points` may end the process inside a call."""

    def __init__(self, run_id: str, calls: int, kill_points: KillPoints) -> None:
        self.run_id = run_id
        self.calls = calls
        self.kill_points = kill_points

    async def __call__(self, transcript: Transcript) -> ModelTurn:
        # A model call takes a moment; an external kill can land inside it too.
        await asyncio.sleep(random.uniform(0.001, 0.01))
        self.kill_points.reach("model", self.run_id)
        return next_turn(self.run_id, self.calls, transcript)


def next_turn(run_id: str, calls: int, transcript: Transcript) -> ModelTurn:
    """What the model answers to `transcript` (see the module docstring)."""
    completed: dict[int, str] = {}
    failed: dict[int, int] = {}
    for message in transcript:
        if message.get("role") != "tool":
            continue
        step = step_of(message["tool_call_id"])
        if step is None:
            continue
        if message.get("status") == "completed":
            completed[step] = json.loads(message["content"])["credit_id"]
        else:
            failed[step] = failed.get(step, 0) + 1
    step = next((k for k in range(calls) if k not in completed), None)
    if step is None:
        ids = ", ".join(completed[k] for k in range(calls))
        return FinalAnswer(f"charged {account(run_id)} {calls} times: {ids}")
    retries = failed.get(step, 0)
    call_id = f"s{step}" if retries == 0 else f"s{step}r{retries}"
    arguments = {
        "account_id": account(run_id),
        "amount_cents": 100 + step,
        "memo": memo(run_id, step),
    }
    return [ToolCallRequest(call_id, tool_for(run_id, step), arguments)]
