"""A fake billing system with the failure modes that make tool calls hard.

It honours idempotency keys like Stripe does (a repeated key returns the first credit), can be
looked up by key (what a reconcile hook needs), and can be told to misbehave once:

- `lose_next_response`: the credit is applied, then the answer is lost (the caller times out);
- `drop_next_request`: the request never arrives (the caller times out, nothing happened);
- `lock(account)`: the account is locked, which the tool checks before sending anything.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from pydantic import BaseModel


class Credit(BaseModel):
    credit_id: str
    account_id: str
    amount_cents: int
    voided: bool = False


@dataclass
class BillingSystem:
    credits: dict[str, Credit] = field(default_factory=dict)
    locked: set[str] = field(default_factory=set)
    lose_next_response: bool = False
    drop_next_request: bool = False
    requests: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1001))

    def lock(self, account_id: str) -> None:
        self.locked.add(account_id)

    async def credit(self, account_id: str, amount_cents: int, *, idempotency_key: str) -> Credit:
        self.requests += 1
        if self.drop_next_request:
            self.drop_next_request = False
            await asyncio.sleep(3600)  # the caller's timeout fires; nothing was applied
        credit = self.credits.get(idempotency_key)
        if credit is None:
            credit = Credit(
                credit_id=f"cr_{next(self._ids)}", account_id=account_id, amount_cents=amount_cents
            )
            self.credits[idempotency_key] = credit
        if self.lose_next_response:
            self.lose_next_response = False
            await asyncio.sleep(3600)  # applied, but the answer never comes back
        return credit

    async def find_credit(self, idempotency_key: str) -> Credit | None:
        return self.credits.get(idempotency_key)

    async def void(self, idempotency_key: str) -> Credit:
        credit = self.credits[idempotency_key].model_copy(update={"voided": True})
        self.credits[idempotency_key] = credit
        return credit

    def live_credits(self) -> int:
        return sum(1 for c in self.credits.values() if not c.voided)


#: The one billing system the example's tools talk to (a real deployment has a client here).
system = BillingSystem()
