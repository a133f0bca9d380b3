"""Penny pays a refund, crashes before writing down that she did, and restarts.

Her payments provider has no idempotency keys, so nothing on its side stops a second payout.
Without the ledger the restart pays again: two payouts. With it, the restart asks the ledger
for call `penny-run:refund-1`, which completed before the crash, and gets the recorded payout
back: one payout. (Had she crashed before the ledger heard the outcome, the reconcile hook
would find the payout by the reference Penny stored on it.)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from pydantic import BaseModel
from rich.console import Console

from toolledger import (
    Ledger,
    ReconcileOutcome,
    ToolContext,
    ToolExecutionRecord,
    Toolset,
    external,
)


class Payout(BaseModel):
    payout_id: str
    customer_id: str
    amount_cents: int
    reference: str | None = None


@dataclass
class Payouts:
    """A payments provider without idempotency keys (a reference field is all it offers)."""

    made: list[Payout] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def pay(self, customer_id: str, amount_cents: int, reference: str | None) -> Payout:
        payout = Payout(
            payout_id=f"po_{next(self._ids)}",
            customer_id=customer_id,
            amount_cents=amount_cents,
            reference=reference,
        )
        self.made.append(payout)
        return payout

    async def find(self, reference: str) -> Payout | None:
        return next((p for p in self.made if p.reference == reference), None)


payouts = Payouts()
penny = Toolset("penny")


async def find_payout(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    """Look the payout up by the reference Penny stores on it: the idempotency key."""
    payout = await payouts.find(record.idempotency_key)
    if payout is None:
        return ReconcileOutcome(status="unknown")
    return ReconcileOutcome(status="completed", value=payout, result_reference=payout.payout_id)


@penny.tool(external(), reconcile=find_payout)
async def pay_refund(customer_id: str, amount_cents: int, context: ToolContext) -> Payout:
    """Pay a refund, storing the call's idempotency key as the payout's reference."""
    async with context.sending():
        return await payouts.pay(customer_id, amount_cents, reference=context.idempotency_key)


class Crash(Exception):
    """Penny's process dies (here: right after the payout, before she notes it down)."""


async def without_ledger(console: Console) -> int:
    notes: dict[str, Payout] = {}
    for life in ("first run", "after restart"):
        if "refund-1" in notes:
            continue
        payout = await payouts.pay("cust-7", 2500, reference=None)
        console.print(f"  {life}: Penny pays {payout.payout_id}")
        if life == "first run":
            console.print("  [red]crash[/red] before Penny writes the payout down")
            continue
        notes["refund-1"] = payout
    return len(payouts.made)


async def with_ledger(console: Console, ledger: Ledger) -> int:
    notes: dict[str, Payout] = {}
    for life in ("first run", "after restart"):
        if "refund-1" in notes:
            continue
        outcome = await ledger.call(
            pay_refund,
            run_id="penny-run",
            tool_call_id="refund-1",
            tenant_id="heist",
            arguments={"customer_id": "cust-7", "amount_cents": 2500},
        )
        source = "the ledger's recorded result" if outcome.replayed else "a new payout"
        console.print(f"  {life}: {outcome.result().payout_id} ({source})")
        if life == "first run":
            console.print("  [red]crash[/red] before Penny writes the payout down")
            continue
        notes["refund-1"] = outcome.result()
    return len([p for p in payouts.made if p.reference is not None])


async def main(console: Console | None = None) -> tuple[int, int]:
    """Both runs; returns (payouts without the ledger, payouts with it)."""
    console = console or Console()
    payouts.made.clear()
    console.rule("Penny without the ledger")
    unguarded = await without_ledger(console)
    console.print(f"  payouts made: [bold red]{unguarded}[/bold red]")
    payouts.made.clear()
    console.rule("Penny with the ledger")
    async with await Ledger.memory() as ledger:
        guarded = await with_ledger(console, ledger)
    console.print(f"  payouts made: [bold green]{guarded}[/bold green]")
    console.print(f"penny: without ledger {unguarded} payouts, with ledger {guarded} payout")
    return unguarded, guarded
