"""A runtime process making pipelined calls, for the tests that need a real second OS process.

It connects to the ledger from the `TOOLLEDGER_*` environment (no projector: the test process
runs it) and uses the fake billing system in the `--service` file.

`race --keys N`: writes `--ready`, waits for the `--go` file, makes the pipelined calls
`r1:k1` ... `r1:kN` all at once, and prints one JSON line: key -> credit id or error name.

`crash --at WHERE --call C`: makes the pipelined call `r1:C` and stops, writing `--ready`, at
one of the points a SIGKILL can find a pipelined call (the test then kills it):

- `tool`: inside the tool, right after the credit was made (the reservation is acknowledged;
  its verdict may not have been reached);
- `outcome`: the tool returned; its outcome is about to be appended, and never will be;
- `verdict`: the outcome is acknowledged by Kafka; the call is waiting for the reservation's
  verdict (and would return on it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.fake_billing import FakeBilling, use_service
from tests.pipelined_tools import credit, credit_then_stall, stall
from toolledger import Ledger, ToolCallError
from toolledger.events.log import Position
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.settings import load_settings

ARGS = {"account_id": "acct-1", "amount_cents": 2500}
_OUTCOMES = {"call_completed", "call_failed", "call_indeterminate"}


async def _race(ledger: Ledger, args: argparse.Namespace) -> None:
    Path(args.ready).write_text("ready")
    give_up = time.monotonic() + 20
    while not Path(args.go).exists():
        if time.monotonic() > give_up:
            raise SystemExit("the test never said go")
        await asyncio.sleep(0.002)
    keys = [f"k{n}" for n in range(1, args.keys + 1)]
    got = await asyncio.gather(
        *(
            ledger.call(credit, run_id="r1", tool_call_id=k, tenant_id="acme", arguments=ARGS)
            for k in keys
        ),
        return_exceptions=True,
    )
    answers: dict[str, Any] = {}
    for key, answer in zip(keys, got, strict=True):
        if isinstance(answer, ToolCallError):
            answers[key] = type(answer).__name__
        elif isinstance(answer, BaseException):
            raise answer
        else:
            answers[key] = answer.result().credit_id
    sys.stdout.write(json.dumps(answers) + "\n")
    sys.stdout.flush()


async def _stop_here(ready: str, what: str) -> None:
    Path(ready).write_text(what)
    await asyncio.Event().wait()  # the test SIGKILLs this process here


async def _crash(ledger: Ledger, args: argparse.Namespace) -> None:
    commands, waiter = ledger.stack.commands, ledger.stack.waiter
    append, wait = commands.append, waiter.wait
    tool = credit
    if args.at == "tool":
        tool, stall.marker = credit_then_stall, Path(args.ready)
    outcome_acknowledged = asyncio.Event()

    async def frozen_append(event: Event, timeout: float) -> Position:
        if event.type in _OUTCOMES and args.at == "outcome":
            await _stop_here(args.ready, event.key)
        position = await append(event, timeout)
        if event.type in _OUTCOMES:
            outcome_acknowledged.set()
        return position

    async def frozen_wait(
        event_id: uuid.UUID, timeout: float, expected: asyncio.Future[Verdict] | None = None
    ) -> Verdict:
        if args.at == "verdict":
            await outcome_acknowledged.wait()
            await _stop_here(args.ready, "verdict")
        return await wait(event_id, timeout, expected)

    commands.append = frozen_append  # type: ignore[method-assign]
    waiter.wait = frozen_wait  # type: ignore[method-assign]
    await ledger.call(tool, run_id="r1", tool_call_id=args.call, tenant_id="acme", arguments=ARGS)


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["race", "crash"])
    parser.add_argument("--service", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--go", default="")
    parser.add_argument("--keys", type=int, default=1)
    parser.add_argument("--at", choices=["tool", "outcome", "verdict"], default="tool")
    parser.add_argument("--call", default="c1")
    args = parser.parse_args(argv)
    use_service(FakeBilling(Path(args.service)))
    # Its kill points are the direct path's (the commands' append, the waiter's wait): the
    # leader fast path answers without either, so this worker stays on the direct path.
    settings = load_settings(leader="off")
    async with await Ledger.connect(settings) as ledger:
        if args.mode == "race":
            await _race(ledger, args)
        else:
            await _crash(ledger, args)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
