"""The billing toolset: one credit tool with a reconcile hook and a compensation.

This is the shape every side-effecting tool should have: it passes `context.idempotency_key`
to the system it changes, marks with `context.sending()` the moment a request may leave, refuses
before sending when it can (`ToolNotAttemptedError`), and can be looked up by key afterwards.
"""

from __future__ import annotations

from toolledger import (
    ReconcileOutcome,
    ToolContext,
    ToolExecutionRecord,
    ToolNotAttemptedError,
    Toolset,
    external,
)
from toolledger.examples.billing_reconciliation.billing import Credit, system

billing = Toolset("billing")


async def find_credit(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    """Look the credit up by its idempotency key."""
    credit = await system.find_credit(record.idempotency_key)
    if credit is None:
        return ReconcileOutcome(status="unknown", detail="no credit under this key")
    return ReconcileOutcome(status="completed", value=credit, result_reference=credit.credit_id)


async def void_credit(record: ToolExecutionRecord, context: ToolContext) -> Credit:
    """Undo a credit (run only when an operator asks, as its own ledgered call)."""
    async with context.sending():
        return await system.void(record.idempotency_key)


@billing.tool(external(), reconcile=find_credit, compensation=void_credit, timeout=0.3)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Credit a customer's account."""
    if account_id in system.locked:
        raise ToolNotAttemptedError(f"account {account_id} is locked; nothing was sent")
    async with context.sending():
        return await system.credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
