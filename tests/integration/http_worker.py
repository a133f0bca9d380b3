"""A runtime process that makes one HTTP refund and is SIGKILLed while the request is held.

`python -m tests.integration.http_worker` connects to the ledger from the `TOOLLEDGER_*`
environment (no projector: the test process runs it) and calls `shop.refund` as r1:c1 against
the fake payments API that `HTTP_TOOLS_PAYMENTS_URL` names (`tests.http_tools`). The test
holds the request at the fake and kills this process there: the ledger says `started`, and the
refund is made after the runtime is gone, its answer lost.
"""

from __future__ import annotations

import asyncio

from tests import http_tools
from toolledger import Ledger

ARGUMENTS = {"charge": "ch_1", "amount": 2500, "memo": "killed mid-request"}


async def main() -> None:
    async with await Ledger.connect() as ledger:
        await ledger.call(
            http_tools.refund, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGUMENTS
        )


if __name__ == "__main__":
    asyncio.run(main())
