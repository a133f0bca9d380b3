"""What the three framework examples share: Penny's refund tool, a flaky payments provider,
and an operator who settles the unknown refund (`toolledger.testing.Operator`: the operator API's
own signed decision, in process).

The provider pays the refund and then stops answering, so the refund times out: nobody knows
whether it was paid. Left to the framework, the model would hear "An error occurred... Please
try again" and refund again. With toolledger the run pauses instead; the operator looks the
payout up by the call's idempotency key (the provider stores it), resolves the call (in
production: `toolledger executions resolve`, the console or the API), and the resumed run
tells the customer the truth. One payout.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from pydantic import BaseModel

from toolledger import Ledger, ToolContext, Toolset, external
from toolledger.testing import Operator

TENANT = "acme"
PROMPT = "Hi, I'm cus_42. Order 7 arrived broken, please refund the 25.00."
REFUND = {"customer_id": "cus_42", "amount_cents": 2500}


class Payout(BaseModel):
    payout_id: str
    customer_id: str
    amount_cents: int


@dataclass
class Payments:
    """A payments provider that stores the idempotency key, and answers slowly once."""

    made: dict[str, Payout] = field(default_factory=dict)
    slow_once: bool = True
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def pay(self, customer_id: str, amount_cents: int, idempotency_key: str) -> Payout:
        if idempotency_key not in self.made:
            payout = Payout(
                payout_id=f"po_{next(self._ids)}",
                customer_id=customer_id,
                amount_cents=amount_cents,
            )
            self.made[idempotency_key] = payout
        if self.slow_once:
            self.slow_once = False
            await asyncio.sleep(5)  # paid, then the connection hangs: the refund times out
        return self.made[idempotency_key]


payments = Payments()
penny = Toolset("penny")


@penny.tool(external(), timeout=0.5)
async def refund(customer_id: str, amount_cents: int, context: ToolContext) -> Payout:
    """Refund a customer (amount in cents)."""
    async with context.sending():
        return await payments.pay(customer_id, amount_cents, context.idempotency_key)


@asynccontextmanager
async def embedded_ledger() -> AsyncIterator[tuple[Ledger, Operator]]:
    """The embedded ledger, and Olivia, an operator who decides in process (signed as the API
    signs, with the key the embedded ledger's projector verifies)."""
    async with await Ledger.memory() as ledger:
        yield ledger, Operator(ledger, tenant_id=TENANT, name="olivia")


async def operator_settles(olivia: Operator, key: str) -> None:
    """Olivia finds the payout under the key in the provider's dashboard and resolves the call."""
    payout = payments.made[key]
    record = await olivia.resolve(
        key,
        outcome="completed",
        reason=f"payout {payout.payout_id} found under the key",
        value=payout.model_dump(),
    )
    print(f"operator: resolved {key} -> {record.status}")


def report(answer: str) -> None:
    print(f"penny: {answer}")
    print(f"payouts made: {len(payments.made)}")
