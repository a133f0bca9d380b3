"""What the three framework examples share: Penny's refund tool, a flaky payments provider,
and an operator who settles the unknown refund over the HTTP API.

The provider pays the refund and then stops answering, so the refund times out: nobody knows
whether it was paid. Left to the framework, the model would hear "An error occurred... Please
try again" and refund again. With toolledger the run pauses instead; the operator looks the
payout up by the call's idempotency key (the provider stores it), resolves the call over the
API, and the resumed run tells the customer the truth. One payout.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from toolledger import Ledger, Settings, ToolContext, Toolset, external
from toolledger.api import create_app
from toolledger.api.tokens import MemoryTokens

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
async def embedded_ledger() -> AsyncIterator[tuple[Ledger, httpx.AsyncClient]]:
    """The embedded ledger, and an operator's client of its HTTP API (served in-process)."""
    keys = {"example": secrets.token_hex(16)}
    async with await Ledger.memory({k: v.encode() for k, v in keys.items()}) as ledger:
        tokens = MemoryTokens()
        token = (await tokens.create(TENANT, "olivia", "operator", timedelta(hours=1))).token
        app = create_app(ledger.stack, Settings(signing_keys=keys), tokens=tokens)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://api",
            headers={"Authorization": f"Bearer {token}"},
        ) as api:
            yield ledger, api


async def operator_settles(api: httpx.AsyncClient, key: str) -> None:
    """Olivia finds the payout under the key in the provider's dashboard and resolves the call."""
    payout = payments.made[key]
    response = await api.post(
        f"/v1/tool-executions/{quote(key, safe='')}/resolve",
        json={
            "outcome": "completed",
            "reason": f"payout {payout.payout_id} found under the key",
            "value": payout.model_dump(),
        },
    )
    response.raise_for_status()
    print(f"operator: POST .../{key}/resolve -> {response.status_code}")


def report(answer: str) -> None:
    print(f"penny: {answer}")
    print(f"payouts made: {len(payments.made)}")
