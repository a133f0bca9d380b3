"""One refund over HTTP, however the connection ends: `toolledger.http` and a key-replaying API.

    python -m toolledger.examples.http_refund.refund

The refund tool is three lines of httpx through `ToolHTTP`: the client sets the call's
`Idempotency-Key`, marks the moment the request leaves, and turns each ending into what the
ledger records. The payments API (`toolledger.http.fake`, a local Stripe-like fake)
replays its first answer for a repeated key, and the tool says so
(`external(replays_key_for=timedelta(hours=24))`).

The run: the fake makes the refund and then drops the connection before answering, so nobody
knows whether it happened and the call is `indeterminate`, never rerun by itself. When the model
asks again (a replay of the same key), toolledger resends the request with the same key; the
fake replays its first answer, the model hears it, and one refund exists. The reconciler would
have done the same in the background (`toolledger reconciler --tools ...`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from toolledger import (
    Ledger,
    ToolCallIndeterminate,
    ToolContext,
    ToolOutcome,
    Toolset,
    external,
)
from toolledger.http import ToolHTTP
from toolledger.http.fake import FakePayments

api = FakePayments()  # listens on a free loopback port once started
payments = ToolHTTP(base_url=api.url, statuses={409: "in_progress"})
billing = Toolset("billing")


class Refund(BaseModel):
    id: str
    charge: str
    amount: int


@billing.tool(external(replays_key_for=timedelta(hours=24)))
async def refund(charge: str, amount: int, context: ToolContext) -> Refund:
    """Refund `amount` cents of `charge`."""
    answer = await payments.post(
        "/v1/refunds", json={"charge": charge, "amount": amount}, context=context
    )
    return Refund.model_validate(answer.json())


async def main() -> None:
    async with api, payments, await Ledger.memory() as ledger:

        async def ask() -> ToolOutcome[Refund]:
            """The model's call r1:c1; asked twice, it is one call."""
            arguments = {"charge": "ch_1", "amount": 2500}
            return await ledger.call(
                refund, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=arguments
            )

        api.script.append("drop")  # the refund is made, then the connection dies unanswered
        try:
            await ask()
        except ToolCallIndeterminate as exc:
            print(f"unknown: {exc.key} (the connection dropped after the request left)")
        outcome = await ask()  # a replay of the key: resent with the same key
        print(f"the model hears: {outcome.result()!r} (replayed={outcome.replayed})")
        print(f"refunds made: {len(api.refunds)}; requests: {len(api.posts())}")


if __name__ == "__main__":
    asyncio.run(main())
