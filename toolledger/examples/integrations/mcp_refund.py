"""Penny the refund bot as an MCP client: refunds served over MCP, each made once.

Run it: `python -m toolledger.examples.integrations.mcp_refund` (offline: the embedded ledger, an
in-process MCP client, an in-process operator: `toolledger.testing.Operator`).

1. Penny asks the server for a refund, and crashes before noting the answer. After her restart
   she sends the same call again, with the same key in `_meta`: the server returns the
   recorded payout, and the provider (which has no idempotency keys) pays nothing more.
2. The provider pays the second refund, then hangs. The server answers "unknown: do not
   retry", not an error to try again. Penny's model repeats the refund as a new tool call
   anyway: the duplicate-intent guard holds it. An operator finds the payout and resolves the
   call (signed as the API signs); the same key then returns it.

One payout per customer, whatever Penny does.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from dataclasses import dataclass, field

import mcp.types as types
from mcp import Client
from pydantic import BaseModel

from toolledger import Ledger, SigningKey, ToolContext, Toolset, external
from toolledger.integrations.mcp import LedgerMCPServer, call_tool_keyed
from toolledger.testing import Operator

RUN = "penny-run"
SIGNING = SigningKey.generate("ops-1")


class Payout(BaseModel):
    payout_id: str
    customer_id: str
    amount_cents: int


@dataclass
class Payouts:
    """A payments provider without idempotency keys, which hangs for the customers listed."""

    made: list[Payout] = field(default_factory=list)
    hangs_for: set[str] = field(default_factory=set)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def pay(self, customer_id: str, amount_cents: int) -> Payout:
        payout = Payout(
            payout_id=f"po_{next(self._ids)}", customer_id=customer_id, amount_cents=amount_cents
        )
        self.made.append(payout)
        if customer_id in self.hangs_for:
            await asyncio.sleep(60)  # paid, but the answer never comes back
        return payout


payouts = Payouts(hangs_for={"cust-2"})
penny = Toolset("penny")


@penny.tool(external(), timeout=0.3)
async def pay_refund(customer_id: str, amount_cents: int, context: ToolContext) -> Payout:
    """Pay a customer a refund."""
    async with context.sending():
        return await payouts.pay(customer_id, amount_cents)


def said(result: types.CallToolResult) -> str:
    status = (result.meta or {}).get("dev.toolledger/status")
    body = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
    return f"{status}: {body[:150]}{'...' if len(body) > 150 else ''}"


async def main() -> int:
    async with await Ledger.memory(SIGNING) as ledger:
        server = LedgerMCPServer(ledger, penny, tenant_id="penny-shop")
        olga = Operator(ledger, tenant_id="penny-shop", name="olga")
        name = server.names.model_name("penny.pay_refund")

        async def refund(call_id: str, customer: str) -> types.CallToolResult:
            async with Client(server.server) as client:  # a fresh connection each time
                arguments = {"customer_id": customer, "amount_cents": 2500}
                return await call_tool_keyed(
                    client, name, arguments, run_id=RUN, tool_call_id=call_id
                )

        print(f"1. {name} (call refund-1) -> {said(await refund('refund-1', 'cust-1'))}")
        print("   penny crashes before noting it; after her restart she sends refund-1 again")
        print(f"   {name} (call refund-1) -> {said(await refund('refund-1', 'cust-1'))}")

        print(f"2. {name} (call refund-2) -> {said(await refund('refund-2', 'cust-2'))}")
        print("   the model repeats the refund as a new tool call, refund-3")
        print(f"   {name} (call refund-3) -> {said(await refund('refund-3', 'cust-2'))}")
        found = next(p for p in payouts.made if p.customer_id == "cust-2")
        settled = await olga.resolve(
            f"{RUN}:refund-2",
            outcome="completed",
            reason=f"payout {found.payout_id} found in the provider's dashboard",
            value=found.model_dump(),
        )
        print(f"   operator: resolved {RUN}:refund-2 -> {settled.status}")
        print(f"   {name} (call refund-2) -> {said(await refund('refund-2', 'cust-2'))}")
        print(f"   {name} (call refund-3) -> {said(await refund('refund-3', 'cust-2'))}")

    per_customer = {c: sum(p.customer_id == c for p in payouts.made) for c in ("cust-1", "cust-2")}
    print(f"payouts made: {len(payouts.made)} ({per_customer})")
    return 0 if per_customer == {"cust-1": 1, "cust-2": 1} else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
