"""A runtime process for the "two ways a tool runs twice" that need a real second process.

`python -m tests.integration.crash_worker crash ...` connects to the ledger from the
`TOOLLEDGER_*` environment (no projector: the test process runs it), calls a billing tool, and
freezes right after the tool returned, at the moment its outcome would be appended: it writes
the `--ready` file and waits to be SIGKILLed. The effect exists in the fake billing system; the
ledger says `started`. That is the crash the replay tests recover from.

`python -m tests.integration.crash_worker race ...` connects, writes `--ready`, waits for the
`--go` file, makes the call, and prints what it got as one JSON line: the other half of "two
OS processes call one key at once".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.fake_billing import FakeBilling, billing, use_service
from toolledger import Ledger, ToolCallError
from toolledger.events.log import Position
from toolledger.events.models import Event
from toolledger.events.records import Verdict

_OUTCOMES = {"call_completed", "call_failed", "call_indeterminate"}


def _touch(path: str, text: str) -> None:
    Path(path).write_text(text)


def _exists(path: str) -> bool:
    return Path(path).exists()


async def _crash(ledger: Ledger, args: argparse.Namespace) -> None:
    """Run the call, and freeze where its outcome would be appended."""
    append = ledger.stack.commands.append

    async def freeze_before_outcome(event: Event) -> None:
        if event.type in _OUTCOMES:
            _touch(args.ready, event.key)
            await asyncio.Event().wait()  # the test SIGKILLs this process here

    async def frozen_append(event: Event, timeout: float) -> Position:
        await freeze_before_outcome(event)
        return await append(event, timeout)

    ledger.stack.commands.append = frozen_append  # type: ignore[method-assign]
    # On the leader fast path an outcome never reaches the commands: freeze the port too.
    port = ledger.port
    port_append, port_append_and_await = port.append, port.append_and_await

    async def frozen_port_append(event: Event, timeout: float) -> None:
        await freeze_before_outcome(event)
        await port_append(event, timeout)

    async def frozen_port_append_and_await(event: Event, timeout: float) -> Verdict:
        await freeze_before_outcome(event)
        return await port_append_and_await(event, timeout)

    port_until_landed = port.append_until_landed

    async def frozen_until_landed(event: Event, *, each: float, pause: float) -> None:
        await freeze_before_outcome(event)
        await port_until_landed(event, each=each, pause=pause)

    port.append_until_landed = frozen_until_landed  # type: ignore[method-assign]
    port.append = frozen_port_append  # type: ignore[method-assign]
    port.append_and_await = frozen_port_append_and_await  # type: ignore[method-assign]
    await _call(ledger, args)


async def _race(ledger: Ledger, args: argparse.Namespace) -> None:
    _touch(args.ready, "ready")
    give_up = time.monotonic() + 20
    while not _exists(args.go):
        if time.monotonic() > give_up:
            raise SystemExit("the test never said go")
        await asyncio.sleep(0.002)
    try:
        outcome = await _call(ledger, args)
    except ToolCallError as exc:
        result: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    else:
        value = outcome.value
        result = {
            "status": outcome.status,
            "credit_id": getattr(value, "credit_id", None),
            "replayed": outcome.replayed,
        }
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


async def _call(ledger: Ledger, args: argparse.Namespace) -> Any:
    tool = billing.get(f"billing.{args.tool}")
    assert tool is not None, args.tool
    return await ledger.call(
        tool,
        run_id=args.run,
        tool_call_id=args.call,
        tenant_id="acme",
        arguments={"account_id": args.account, "amount_cents": args.amount},
    )


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["crash", "race"])
    parser.add_argument("--service", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--go", default="")
    parser.add_argument("--tool", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--call", required=True)
    parser.add_argument("--account", default="acct-1")
    parser.add_argument("--amount", type=int, default=2500)
    args = parser.parse_args(argv)
    use_service(FakeBilling(Path(args.service)))
    async with await Ledger.connect() as ledger:
        if args.mode == "crash":
            await _crash(ledger, args)
        else:
            await _race(ledger, args)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
