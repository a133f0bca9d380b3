"""Tools written with `toolledger.http` against the fake payments API
(`toolledger.examples.http_refund`).

`payments` points at `PAYMENTS_URL_ENV` when a child process (a runtime worker, a
`toolledger reconciler --tools tests.http_tools`) is given it; in the test process it is a
placeholder, and each test swaps in a client on its own fake's port and event loop
(`use_payments`), which the tools find by name at call time. The declarations resolve the name
once, to know that the tools pass their key and mark sending.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from pydantic import BaseModel

from toolledger import ToolContext, Toolset, external, read
from toolledger.http import Outcome, ToolHTTP
from toolledger.http.fake import FakePayments

#: The fake's key retention, as the refund tool declares it (Stripe: 24 hours).
REPLAY_WINDOW = timedelta(hours=24)
#: How the fake says "a request with this key is still being processed".
STATUSES: dict[int, Outcome] = {409: "in_progress"}

#: Where a child process finds the fake payments API.
PAYMENTS_URL_ENV = "HTTP_TOOLS_PAYMENTS_URL"

payments = ToolHTTP(base_url=os.environ.get(PAYMENTS_URL_ENV, ""), statuses=STATUSES)
shop = Toolset("shop")


class Refund(BaseModel):
    id: str
    charge: str
    amount: int


class Charge(BaseModel):
    id: str
    amount: int
    refunded: int


@shop.tool(external(replays_key_for=REPLAY_WINDOW), timeout=5)
async def refund(charge: str, amount: int, memo: str, context: ToolContext) -> Refund:
    """Refund part of a charge; the fake replays its first answer for a repeated key."""
    answer = await payments.post(
        "/v1/refunds", json={"charge": charge, "amount": amount, "memo": memo}, context=context
    )
    return Refund.model_validate(answer.json())


@shop.tool(external(), timeout=5)
async def refund_undeclared(charge: str, amount: int, context: ToolContext) -> Refund:
    """The same request, without saying that the downstream replays answers: never resent."""
    answer = await payments.post(
        "/v1/refunds", json={"charge": charge, "amount": amount}, context=context
    )
    return Refund.model_validate(answer.json())


@shop.tool(read(), timeout=5)
async def look_up_charge(charge: str, context: ToolContext) -> Charge:
    """Read a charge: up to three attempts."""
    answer = await payments.get(f"/v1/charges/{charge}", context=context)
    return Charge.model_validate(answer.json())


def use_payments(client: ToolHTTP) -> ToolHTTP:
    """Point the tools at `client` (a test's own); returns the one it replaced."""
    global payments
    previous, payments = payments, client
    return previous


@asynccontextmanager
async def fake_payments() -> AsyncIterator[FakePayments]:
    """A started fake payments API with this process's tools pointed at it; both undone after."""
    async with FakePayments() as fake:
        client = ToolHTTP(base_url=fake.url, statuses=STATUSES)
        previous = use_payments(client)
        try:
            yield fake
        finally:
            use_payments(previous)
            await client.aclose()
