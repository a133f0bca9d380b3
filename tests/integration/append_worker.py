"""A separate OS process that reserves one call and prints the ledger's verdict as JSON.

    python -m tests.integration.append_worker --run RUN --call CALL [--timeout 15]

Configured by `TOOLLEDGER_*` like every toolledger process. It connects first, prints `ready`,
then waits for a line on stdin before it appends, so a test can start two workers and release
them at the same instant: the race is between their appends, not their start-up times. The last
line it prints is the verdict: `{"pid", "event_id", "reservation_id", "accepted", "reason",
"detail"}`. Exit status 0 when a verdict came, 1 on `LedgerUnavailable`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from tests import builders as b
from toolledger.errors import LedgerUnavailable
from toolledger.events.models import Producer
from toolledger.settings import load_settings
from toolledger.wiring.stack import LedgerStack


async def _reserve(run_id: str, tool_call_id: str, timeout: float) -> int:
    stack = await LedgerStack.connect(load_settings(), create_topics=False)
    try:
        event = b.reserved(run_id, tool_call_id).model_copy(
            update={"producer": Producer.this_process()}
        )
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        try:
            verdict = await stack.commands.append_and_await(event, timeout=timeout)
        except LedgerUnavailable as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            return 1
        print(
            json.dumps(
                {
                    "pid": event.producer.pid,
                    "event_id": str(event.event_id),
                    "reservation_id": str(event.reservation_id),
                    "accepted": verdict.accepted,
                    "reason": verdict.reason,
                    "detail": verdict.detail,
                }
            ),
            flush=True,
        )
        return 0
    finally:
        await stack.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="Reserve one call and print its verdict.")
    parser.add_argument("--run", required=True)
    parser.add_argument("--call", required=True)
    parser.add_argument("--timeout", type=float, default=15.0)
    args = parser.parse_args()
    sys.exit(asyncio.run(_reserve(args.run, args.call, args.timeout)))


if __name__ == "__main__":
    main()
