"""The tools of the read barrier's contract suite, importable by an API process (`--tools`).

`credit` completes and has a compensation an operator can ask for; `lost_credit` sends and
loses its answer, so its call is `indeterminate` and an operator resolves it. Neither talks to
anything: the suite is about what readers see of their calls, not about their effects.
"""

from __future__ import annotations

from typing import Any

from toolledger import ToolContext, ToolExecutionRecord, Toolset, external

barrier = Toolset("barrier")


async def void(record: ToolExecutionRecord, context: ToolContext) -> dict[str, str]:
    """Undo a credit (nothing to undo: the credit was never anywhere but in the ledger)."""
    async with context.sending():
        return {"voided": record.idempotency_key}


@barrier.tool(external(), compensation=void, timeout=5)
async def credit(amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """A credit that goes through."""
    async with context.sending():
        return {"credit": context.idempotency_key, "amount_cents": amount_cents}


@barrier.tool(external(), timeout=5)
async def lost_credit(amount_cents: int, context: ToolContext) -> None:
    """A credit whose answer is lost after the request left: the call is indeterminate."""
    async with context.sending():
        raise TimeoutError(f"no answer for the credit {context.idempotency_key}")


TOOLS = {t.name: t for t in barrier}
