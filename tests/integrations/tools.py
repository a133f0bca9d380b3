"""The billing tools the framework tests give their agents, shared with worker processes.

They credit accounts through the fake billing system (`tests/fake_billing.py`, which honours
idempotency keys and counts effects: the judge). `behaviour["credit"]` makes them misbehave on
purpose: `effect_then_timeout` credits and then hangs past the 0.5 s timeout (nobody knows
whether it happened), `effect_then_hang` credits, writes a marker file and hangs until the
process is killed. The names carry a dot (`billing.issue_credit`), which no model API accepts.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.fake_billing import Credit, find_credit, service
from toolledger import ToolContext, Toolset, external

billing = Toolset("billing")
behaviour: dict[str, str] = {"credit": os.environ.get("TEST_CREDIT_BEHAVIOUR", "ok")}
hang_marker: dict[str, str] = {"path": os.environ.get("TEST_HANG_MARKER", "")}

ARGS = {"account_id": "acct-7", "amount_cents": 2500}


async def _credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        if behaviour["credit"] == "effect_then_timeout":
            await asyncio.sleep(5)
        if behaviour["credit"] == "effect_then_hang":
            Path(hang_marker["path"]).write_text(context.idempotency_key)
            await asyncio.Event().wait()
        return credit


@billing.tool(external(), reconcile=find_credit, timeout=0.5)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Credit a customer's account (a refund); reconcilable by idempotency key."""
    return await _credit(account_id, amount_cents, context)


@billing.tool(external(), timeout=0.5)
async def issue_credit_unreconciled(
    account_id: str, amount_cents: int, context: ToolContext
) -> Credit:
    """The same credit without a reconcile hook: an unknown one waits for an operator."""
    return await _credit(account_id, amount_cents, context)


@billing.tool(external(), reconcile=find_credit, timeout=30)
async def issue_credit_patiently(
    account_id: str, amount_cents: int, context: ToolContext
) -> Credit:
    """The credit with a long timeout, so a process can be killed inside it."""
    return await _credit(account_id, amount_cents, context)


@billing.tool(external(approval=True), reconcile=find_credit)
async def refund_large(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A large refund: an operator approves it before it runs."""
    return await _credit(account_id, amount_cents, context)
