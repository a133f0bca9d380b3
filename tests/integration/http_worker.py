"""A runtime process that makes one HTTP refund and is SIGKILLed while the request is held.

`python -m tests.integration.http_worker URL` connects to the ledger from the `TOOLLEDGER_*`
environment (no projector: the test process runs it), points `tests.http_tools` at the fake
payments API at URL and calls `shop.refund` as r1:c1. The test holds the request at the fake
and kills this process there: the ledger says `started`, and the refund is made after the
runtime is gone, its answer lost.
"""

from __future__ import annotations

import asyncio
import sys

from tests import http_tools
from toolledger import Ledger
from toolledger.http import ToolHTTP

ARGUMENTS = {"charge": "ch_1", "amount": 2500, "memo": "killed mid-request"}


async def main(url: str) -> None:
    http_tools.use_payments(ToolHTTP(base_url=url, statuses=http_tools.STATUSES))
    async with await Ledger.connect() as ledger:
        await ledger.call(
            http_tools.refund, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGUMENTS
        )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
