"""Tools and a scripted model for the run tests, shared by the test process and run workers.

`charge` credits an account through the fake billing system (which honours idempotency keys and
counts effects). `behaviour["charge"]` makes it misbehave on purpose: "effect_then_timeout"
makes the credit and then hangs past the tool's timeout, the case where nobody knows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.fake_billing import Credit, find_credit, service
from toolledger import ToolContext, Toolset, external
from toolledger.runtime.runs import FinalAnswer, ModelTurn, ToolCallRequest, Transcript

runs_billing = Toolset("runs")
behaviour: dict[str, str] = {"charge": "ok"}
hang_marker: dict[str, str] = {"path": ""}


@runs_billing.tool(external(), reconcile=find_credit, timeout=0.5)
async def charge(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Charge (credit) an account once per idempotency key."""
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        if behaviour["charge"] == "effect_then_timeout":
            await asyncio.sleep(5)
        return credit


@runs_billing.tool(external(), reconcile=find_credit, timeout=30)
async def charge_patiently(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """`charge` with a long timeout: a process can be killed inside it at leisure."""
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        if behaviour["charge"] == "effect_then_hang":  # a process about to be SIGKILLed
            Path(hang_marker["path"]).write_text(context.idempotency_key)
            await asyncio.Event().wait()
        return credit


@runs_billing.tool(external(approval=True), reconcile=find_credit)
async def refund(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A refund an operator must approve first."""
    async with context.sending():
        return await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


ARGS = {"account_id": "acct-1", "amount_cents": 2500}


class ScriptedModel:
    """Answers from a script; a turn may depend on what the model was last told."""

    def __init__(self, *turns: ModelTurn | str) -> None:
        self.turns: list[ModelTurn | str] = list(turns)
        self.seen: list[Transcript] = []

    async def __call__(self, transcript: Transcript) -> ModelTurn:
        self.seen.append(transcript)
        turn = self.turns.pop(0)
        if turn == "retry-if-failed":
            last = transcript[-1]
            if last.get("status") in ("failed", "indeterminate"):
                return [ToolCallRequest(f"{last['tool_call_id']}-retry", "runs.charge", ARGS)]
            return FinalAnswer("done")
        assert not isinstance(turn, str)
        return turn

    def last_tool_message(self) -> dict[str, Any]:
        tools = [m for m in self.seen[-1] if m.get("role") == "tool"]
        return tools[-1]


def charge_once(call_id: str = "c1") -> Sequence[ModelTurn | str]:
    return ([ToolCallRequest(call_id, "runs.charge", ARGS)], FinalAnswer("charged"))
