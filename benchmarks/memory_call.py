"""The event path's own CPU: `Ledger.memory()` per call of a no-op external tool, sequential.

    python -m benchmarks.memory_call [--calls 2000] [--repeat 5] [--baseline REV]

The embedded ledger does no I/O: its log, store and projector are in this process. So the CPU
a call of a tool that does nothing costs here is what the event path itself costs (building,
encoding and decoding the events, the decider, the history, the facts, the verdict waiter and
the event loop's turns between them), the part every deployment pays before Kafka and
PostgreSQL add theirs. The figure is `time.process_time()` over a block of calls, each a new key
that reserves, runs and records, from the first call until the projector has folded the last
outcome (outcomes return on the log's acknowledgement, so folding them is work the calls
caused), divided by the number of calls.

The floor is the same no-op coroutine called directly with a prebuilt context, plus one
`asyncio.sleep(0)` (a turn of the event loop), in the same process; floor and ledger blocks
alternate within each repetition, every repetition on a fresh memory ledger after a warm-up.
Figures are medians over the repetitions. `--baseline REV` instead compares this tree with the
package at a git revision, one child process per repetition each, alternating
(`benchmarks._baseline`).

It checks its work: the tool ran once per call, and every call's key is `completed` with its
reservation and completion in history.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta

from benchmarks._baseline import add_arguments, child_output, compare
from benchmarks._support import Row, median, say, table
from toolledger import Ledger, ToolContext, Toolset, external
from toolledger.events.models import utcnow

WARMUP = 200
GOAL = "<= 120 us"

# A tool of its own rather than `benchmarks._runtime`'s, so that `--baseline` can run this module
# on older trees, whose toolledger lacks what the other benchmarks' tools declare.
bench = Toolset("bench")
RUNS = {"noop": 0}


@bench.tool(external())
async def noop(n: int, context: ToolContext) -> int:
    """An external tool with no effect: it returns its argument."""
    RUNS["noop"] += 1
    return n


async def _floor(calls: int) -> float:
    """CPU seconds per direct call of the no-op tool plus one event-loop turn."""
    context = ToolContext(
        run_id="floor",
        tool_call_id="c1",
        tenant_id="bench",
        attempt=1,
        deadline=utcnow() + timedelta(seconds=30),
        tool=noop.name,
        idempotency_key="floor:c1",
    )
    before = RUNS["noop"]
    started = time.process_time()
    for n in range(calls):
        await noop.fn(n, context)
        await asyncio.sleep(0)
    spent = time.process_time() - started
    if RUNS["noop"] - before != calls:
        raise RuntimeError(f"the floor ran the tool {RUNS['noop'] - before} times, not {calls}")
    return spent / calls


async def _calls(ledger: Ledger, prefix: str, calls: int) -> None:
    for n in range(calls):
        outcome = await ledger.call(
            noop, run_id=f"{prefix}{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
        )
        if outcome.value != n or outcome.replayed:
            raise RuntimeError(f"{prefix}{n}:c1 did not run the tool once: {outcome}")


async def _folded(ledger: Ledger, key: str) -> None:
    """Until the projector folded the key's outcome (it returned on the log's ack)."""
    while True:
        record = await ledger.stack.store.get_call(key)
        if record is not None and record.status == "completed":
            return
        await asyncio.sleep(0)


async def _ledger(ledger: Ledger, prefix: str, calls: int) -> float:
    """CPU seconds per call, the folding of the last outcome included."""
    before = RUNS["noop"]
    started = time.process_time()
    await _calls(ledger, prefix, calls)
    await _folded(ledger, f"{prefix}{calls - 1}:c1")
    spent = time.process_time() - started
    if RUNS["noop"] - before != calls:
        raise RuntimeError(f"the tool ran {RUNS['noop'] - before} times for {calls} calls")
    return spent / calls


async def check_books(ledger: Ledger, prefix: str, calls: int) -> None:
    """Every call's key `completed`, with its reservation and completion in history."""
    store = ledger.stack.store
    for n in range(calls):
        key = f"{prefix}{n}:c1"
        record = await store.get_call(key)
        history = [e.event_type for e in await store.history(key)]
        if record is None or record.status != "completed" or record.result_json != str(n):
            raise RuntimeError(f"{key} is not completed with result {n}: {record}")
        if history != ["call_reserved", "call_completed"]:
            raise RuntimeError(f"{key} has the history {history}, not a reservation and result")


async def _repetition(calls: int) -> tuple[float, float]:
    """(ledger, floor) CPU seconds per call on a fresh memory ledger, floor blocks around it."""
    async with await Ledger.memory() as ledger:
        await _calls(ledger, "w", WARMUP)
        await _folded(ledger, f"w{WARMUP - 1}:c1")
        floor_before = await _floor(calls)
        per_call = await _ledger(ledger, "r", calls)
        floor_after = await _floor(calls)
        await check_books(ledger, "r", calls)
    return per_call, (floor_before + floor_after) / 2


async def measure(*, calls: int, repeat: int) -> list[Row]:
    ledger_cpu: list[float] = []
    floor_cpu: list[float] = []
    for rep in range(repeat):
        per_call, floor = await _repetition(calls)
        ledger_cpu.append(per_call * 1e6)
        floor_cpu.append(floor * 1e6)
        say(
            f"  {rep + 1}/{repeat}: {ledger_cpu[-1]:.1f} us CPU per call, floor "
            f"{floor_cpu[-1]:.2f} us"
        )
    note = (
        f"{calls} sequential calls x {repeat} repetitions (fresh memory ledger each, {WARMUP} "
        "warm-up calls), until the last outcome is folded; medians of per-repetition means"
    )
    return [
        Row(
            "memory ledger call (external, no-op)",
            "CPU per call",
            median(ledger_cpu),
            "us",
            median(floor_cpu),
            "direct call + sleep(0)",
            GOAL,
            note,
        )
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_call", description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per repetition")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.calls < 1 or args.repeat < 1:
        parser.error("--calls >= 1 and --repeat >= 1, please")
    if args.child:
        print(child_output(*asyncio.run(_repetition(args.child))))
    elif args.baseline:
        compare(
            "benchmarks.memory_call",
            args.calls,
            args.baseline,
            args.repeat,
            "Ledger.memory() CPU per call",
        )
    else:
        print(table(asyncio.run(measure(calls=args.calls, repeat=args.repeat))))


if __name__ == "__main__":  # no services needed
    main()
