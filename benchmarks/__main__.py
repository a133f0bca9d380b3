"""`python -m benchmarks` (`make bench`): run every benchmark and print one table.

Each benchmark measures its own floor in the same run and prints its result as a ratio against
it, as the median of `--repeat` repetitions; BENCHMARKS.md records the figures and what they
mean. Services come from `TOOLLEDGER_DATABASE_URL` / `TOOLLEDGER_KAFKA_BOOTSTRAP` when set,
otherwise from the dev stack, which starts a tansu broker for this run only. Everything made
here (schemas, topics, processes) is removed at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from benchmarks import (
    _backlog,
    catch_up,
    fast_path,
    idle_cpu,
    integrations,
    leader_verdict,
    memory_call,
    read_barrier,
    replay_rate,
    runtime_overhead,
    throughput,
    verdict_latency,
)
from benchmarks._support import Row, Scratch, say, services, table
from toolledger.devstack import Services

BENCHMARKS = (
    "latency",
    "leader",
    "catch-up",
    "replay",
    "overhead",
    "fast-path",
    "barrier",
    "throughput",
    "integrations",
    "memory-call",
    "idle",
)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--events", type=int, default=200_000, help="backlog size for catch-up and replay"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians are reported)")
    parser.add_argument(
        "--samples",
        type=int,
        default=300,
        help="latency samples per repetition (memory-call: ten calls per sample)",
    )
    parser.add_argument(
        "--partitions", type=int, default=4, help="partitions of the backlog's topic"
    )
    parser.add_argument("--batch-size", type=int, default=2000, help="projector batch size")
    parser.add_argument(
        "--budget",
        type=float,
        default=10.0,
        help="seconds a catch-up run may take after its first commit (rate over what it applied)",
    )
    parser.add_argument(
        "--variant",
        choices=catch_up.VARIANTS,
        action="append",
        help="catch-up variants to run (repeatable; default all)",
    )
    parser.add_argument("--runs", type=int, default=64, help="concurrent runs in throughput")
    parser.add_argument("--calls", type=int, default=40, help="calls per run in throughput")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=idle_cpu.SECONDS,
        help="idle: seconds of wall time the quiet stack's CPU is measured over",
    )
    parser.add_argument(
        "--idle-calls",
        type=int,
        default=idle_cpu.CALLS,
        help="idle: calls after an idle spell, per stack",
    )
    parser.add_argument(
        "--idle-baseline",
        metavar="REV",
        help="idle: also run the quiet stack on the package at this git revision, alternating",
    )
    parser.add_argument(
        "--only", choices=BENCHMARKS, action="append", help="run only these (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.samples < 10 or args.events < 1000:
        parser.error("--repeat >= 1, --samples >= 10 and --events >= 1000, please")
    if args.runs < 1 or args.calls < 1:
        parser.error("--runs >= 1 and --calls >= 1, please")
    if args.idle_seconds <= 0 or args.idle_calls < 1:
        parser.error("--idle-seconds > 0 and --idle-calls >= 1, please")
    return args


async def _run(found: Services, args: argparse.Namespace) -> list[Row]:
    # SIGTERM cancels the run like Ctrl-C does, so every `finally` below cleans up.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    chosen = set(args.only or BENCHMARKS)
    scratch = Scratch(found)
    rows: list[Row] = []
    try:
        if "latency" in chosen:
            say("verdict latency")
            rows += await verdict_latency.measure(scratch, samples=args.samples, repeat=args.repeat)
        if "leader" in chosen:
            say("reservation verdict on the leader fast path")
            rows += await leader_verdict.measure(scratch, samples=args.samples, repeat=args.repeat)
        if chosen & {"catch-up", "replay"}:
            say(f"backlog: appending {args.events:,} events")
            backlog = await _backlog.build(scratch, args.events, args.partitions)
            say(f"  appended at {backlog.append_rate:,.0f} events/s")
            if "catch-up" in chosen:
                say("projection catch-up")
                rows += await catch_up.measure(
                    scratch,
                    backlog,
                    repeat=args.repeat,
                    batch_size=args.batch_size,
                    budget=args.budget,
                    variants=[catch_up.VARIANTS[v] for v in args.variant or catch_up.VARIANTS],
                )
            if "replay" in chosen:
                say("replay")
                rows += await replay_rate.measure(scratch, backlog, repeat=args.repeat)
        if "overhead" in chosen:
            say("runtime overhead per call")
            rows += await runtime_overhead.measure(
                scratch, samples=args.samples, repeat=args.repeat
            )
        if "fast-path" in chosen:
            say("fast-path replay")
            rows += await fast_path.measure(scratch, samples=args.samples, repeat=args.repeat)
        if "barrier" in chosen:
            say("the read barrier's cost to a key read")
            rows += await read_barrier.measure(scratch, samples=args.samples, repeat=args.repeat)
        if "throughput" in chosen:
            say(f"throughput: {args.runs} runs x {args.calls} calls")
            rows += await throughput.measure(
                scratch, runs=args.runs, calls=args.calls, repeat=args.repeat
            )
        if "integrations" in chosen:
            say("framework adapters per call (memory ledger)")
            rows += await integrations.measure(samples=args.samples, repeat=args.repeat)
        if "memory-call" in chosen:
            say("the event path's own CPU per call (memory ledger)")
            rows += await memory_call.measure(calls=10 * args.samples, repeat=args.repeat)
        if "idle" in chosen:
            say("idle CPU of a quiet stack")
            rows += await idle_cpu.measure(
                scratch,
                repeat=args.repeat,
                seconds=args.idle_seconds,
                calls=args.idle_calls,
                baseline=args.idle_baseline,
            )
    finally:
        await scratch.cleanup()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    started = time.monotonic()
    with services() as found:
        say(f"services: PostgreSQL {found.database_url}, Kafka {found.kafka_bootstrap}")
        try:
            rows = asyncio.run(_run(found, args))
        except asyncio.CancelledError:
            say("stopped (SIGTERM); cleaned up")
            return 143
    print(table(rows))
    say(f"done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
