"""The drill's payments API: `toolledger.http.fake` as a service process, its refunds in billing.

    python -m toolledger.drill.payments --billing billing.db --address-file payments.url

The drill's refund tool (`drill.refund`, `toolledger.drill.tools`) is written with
`toolledger.http` and talks to this process over loopback HTTP, so the CI drill's kills land on
an HTTP tool too: a runtime SIGKILLed with a request in flight, answers that never come back.
It is its own process, started and stopped by pid by the drill (`Procs`), so it outlives every
runtime the drill kills, as a real payments API would.

Its book is the drill's billing database (`BillingBook` over `DrillBilling`): a refund is a
credit under the request's idempotency key, so the checks count these effects with the same
rules as the other tools' (`toolledger.drill.checks`), and a repeated key replays the first
answer, as Stripe does within its window, which is what lets the ledger settle an unknown
refund by resending it (`external(replays_key_for=...)`). Every request is counted there too,
resends included.

Now and then (`--drop-rate`, seeded) it makes the refund and drops the connection unanswered,
so runtimes also record refunds `indeterminate` themselves, the unknown a kill does not make.
Once listening it writes its URL to `--address-file` (by rename, so a reader never sees half of
it), and it stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolledger.drill.billing import DrillBilling, KeyVoided
from toolledger.http.fake import Answer, FakePayments, answer_json


class BillingBook:
    """Refunds as credits of the drill's billing system, one per idempotency key."""

    def __init__(self, billing: DrillBilling) -> None:
        self.billing = billing

    def refund(self, key: str, request: Mapping[str, Any]) -> Answer:
        try:
            credit, replayed = self.billing.credit_once(
                request["charge"], request["amount"], str(request.get("memo", "")), key=key
            )
        except KeyVoided as exc:
            return answer_json(409, {"error": str(exc)})
        body = {"id": credit.credit_id, "charge": credit.account_id, "amount": credit.amount_cents}
        answer = answer_json(200, body)
        return Answer(answer.status, answer.body, replayed=replayed)

    def charge(self, charge: str) -> Answer:
        return answer_json(404, {"error": f"the drill's payments API keeps no charge {charge}"})


def write_address(path: Path, url: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(url)
    os.replace(tmp, path)


async def serve(billing: Path, address_file: Path, drop_rate: float, seed: int) -> None:
    """Serve until SIGTERM (see the module docstring)."""
    rng = random.Random(seed)

    def unscripted() -> str:
        return "drop" if rng.random() < drop_rate else ""

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with FakePayments(book=BillingBook(DrillBilling(billing)), unscripted=unscripted) as api:
        write_address(address_file, api.url)
        await stop.wait()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m toolledger.drill.payments")
    parser.add_argument("--billing", type=Path, required=True, help="the drill's billing file")
    parser.add_argument(
        "--address-file", type=Path, required=True, help="where to write the URL once listening"
    )
    parser.add_argument(
        "--drop-rate",
        type=float,
        default=0.0,
        help="share of refunds made and then left unanswered (connection dropped)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


if __name__ == "__main__":
    args = _parser().parse_args()
    asyncio.run(serve(args.billing, args.address_file, args.drop_rate, args.seed))
