"""The tools the MCP tests serve, in the test process and in `toolledger mcp serve` children.

They credit accounts through the fake billing system (tests/fake_billing.py), which honours
idempotency keys and counts effects: the judge of "one effect". A child process finds the
billing file in `MCP_TEST_BILLING_DB` (set before `--tools tests.integrations.mcp_tools`
imports this module); the test process calls `use_service` itself.

The toolset's name has a dot (`shop.refunds`) so every tool name has two (`shop.refunds.issue`),
which the model-facing names (`shop__refunds__issue`) must carry and map back.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.fake_billing import Credit, FakeBilling, find_credit, service, use_service
from toolledger import (
    ToolContext,
    ToolFailedError,
    ToolNotAttemptedError,
    Toolset,
    external,
    read,
)

if os.environ.get("MCP_TEST_BILLING_DB"):
    use_service(FakeBilling(Path(os.environ["MCP_TEST_BILLING_DB"])))

refunds = Toolset("shop.refunds")


@refunds.tool(external(), reconcile=find_credit)
async def issue(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Refund an account: one credit per idempotency key."""
    async with context.sending():
        return await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@refunds.tool(external(), reconcile=find_credit)
async def issue_slowly(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The refund, then a moment before answering: two servers given one key overlap."""
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
    await asyncio.sleep(0.5)
    return credit


@refunds.tool(external(), reconcile=find_credit, timeout=60)
async def issue_then_stall(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The refund lands, then the answer never comes: the server is killed meanwhile."""
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        await asyncio.sleep(120)
    return credit


@refunds.tool(external(), timeout=0.3)
async def issue_timing_out(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The refund lands and the answer times out; no reconcile hook: only an operator knows."""
    async with context.sending():
        await service().credit(account_id, amount_cents, idempotency_key=context.idempotency_key)
        await asyncio.sleep(30)
    raise AssertionError("unreachable: the tool times out first")


@refunds.tool(external(approval=True))
async def issue_large(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A refund over the limit: an operator approves it first."""
    async with context.sending():
        return await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@refunds.tool(external())
async def issue_to_closed(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The billing system refuses: the account is closed (a definite no)."""
    async with context.sending():
        raise ToolFailedError(f"account {account_id} is closed")


@refunds.tool(external())
async def issue_without_token(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The billing token expired before anything was sent."""
    raise ToolNotAttemptedError("the billing token expired; refresh it")


@refunds.tool(read())
async def balance(account_id: str, context: ToolContext) -> dict[str, int]:
    """How many credits the billing system holds (a read: safe to repeat)."""
    return {"credits": service().effects()}
