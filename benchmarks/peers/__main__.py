"""`python -m benchmarks.peers` (`make bench-peers`): toolledger, Restate and DBOS side by side.

The same two workloads on each system, of the shape of toolledger's own benchmarks: the serial
per-step overhead (`benchmarks/runtime_overhead.py`: one no-op step at a time, p50 of the time
from the call to its durable result) and 64 concurrent runs of sequential steps
(`benchmarks/throughput.py`: steps completed over the wall time of the round). toolledger runs
twice, verdict-first and pipelined (`external(pipelined=True)`, issue 17), and both also time
serial calls of a 50 ms tool: the p50 of each call's time less the tool's own is what the ledger
adds to a tool that takes time. The systems take
turns within each round, the order rotating from round to round, so all three see the same
machine at nearly the same moments; every figure is the median over the rounds, and each ratio
the median of the per-round ratios. CPU time per step comes from /proc for every process doing a
system's work (`benchmarks.peers._cpu`), over the concurrent phase.

The peers run from `.toolledger/peers/` (`make bench-peers` installs them there, in a virtualenv
of their own); toolledger from this environment, on a broker started for the run: Apache Kafka
(`--kafka apache`, the default: the broker users run) or tansu (`--kafka tansu`), so one session
can record toolledger's rows on both; the broker's CPU share is found by its port either way.
Everything started is stopped by pid, and every schema, topic and database made is dropped, also
after an error or Ctrl-C. At the end each system proves its books: every step asked for ran
once and is durably recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import asyncpg

from benchmarks._runtime import running_ledger
from benchmarks._support import Scratch, median, percentile, say, services
from benchmarks.peers import _procs
from benchmarks.peers._cpu import listener_pid, snapshot, used
from benchmarks.peers._dbos import Dbos
from benchmarks.peers._restate import Restate
from benchmarks.peers._systems import (
    System,
    Toolledger,
    ToolledgerLeader,
    ToolledgerLeaderPipelined,
    ToolledgerPipelined,
)
from benchmarks.peers.report import Round, render
from benchmarks.peers.sixths import traced
from toolledger.devstack import KAFKA_BOOTSTRAP_ENV, Services

#: Seconds over which each system's idle CPU is measured, once, before the rounds.
IDLE_WINDOW = 3.0
#: Every system's name, in the order the rounds start from.
SYSTEMS = (
    Toolledger.name,
    ToolledgerPipelined.name,
    ToolledgerLeader.name,
    ToolledgerLeaderPipelined.name,
    Restate.name,
    Dbos.name,
)
#: The peers, which `make bench-peers` installs.
PEERS = (Restate.name, Dbos.name)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="rounds (medians are reported)")
    parser.add_argument("--samples", type=int, default=200, help="serial steps per round")
    parser.add_argument("--runs", type=int, default=64, help="concurrent runs per round")
    parser.add_argument("--calls", type=int, default=40, help="steps per concurrent run")
    parser.add_argument(
        "--naps", type=int, default=40, help="serial calls of a 50 ms tool per round (toolledger)"
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="SYSTEM",
        help="run only this system (repeatable; e.g. --only 'toolledger leader'): the peers "
        "need not be installed when none of them is named",
    )
    parser.add_argument(
        "--kafka",
        choices=["apache", "tansu"],
        default="apache",
        help="the broker toolledger's rows run on, started for this run (unless "
        "TOOLLEDGER_KAFKA_BOOTSTRAP names one): Apache Kafka, or tansu, the quick local one",
    )
    args = parser.parse_args(argv)
    unknown = set(args.only or ()) - set(SYSTEMS)
    if unknown:
        parser.error(f"--only: no system named {', '.join(sorted(unknown))}; one of {SYSTEMS}")
    if args.rounds < 1 or args.samples < 10 or args.runs < 1 or args.calls < 1 or args.naps < 1:
        parser.error(
            "--rounds >= 1, --samples >= 10, --runs >= 1, --calls >= 1 and --naps >= 1, please"
        )
    return args


async def _round(system: System, n: int, args: argparse.Namespace) -> Round:
    times = await system.serial(args.samples, f"s{n}")
    before = await snapshot(system.parts())
    elapsed, trace = await traced(
        _concurrent(system, args, f"c{n}"), lambda: system.done, before.cpu
    )
    after = await snapshot(system.parts())
    steps = args.runs * args.calls
    cpu = {part: seconds / steps for part, seconds in used(before, after).items()}
    added = await system.added(args.naps, f"n{n}")
    return Round(
        percentile(times, 50),
        steps / elapsed,
        cpu,
        None if added is None else percentile(added.times, 50),
        None if added is None else percentile(added.floors, 50),
        times,
        trace,
    )


async def _concurrent(system: System, args: argparse.Namespace, label: str) -> float:
    """The concurrent phase's seconds; the system settles after it (its CPU counted)."""
    elapsed = await system.concurrent(args.runs, args.calls, label)
    await system.settle()
    return elapsed


async def _idle(system: System) -> dict[str, float]:
    """CPU seconds per second each part of `system` spends doing nothing (pollers, timers),
    over `IDLE_WINDOW` seconds after the warm-up: at a low step rate this share of a phase's
    CPU time is most of what a step seems to cost, so the report shows it beside."""
    before = await snapshot(system.parts())
    await asyncio.sleep(IDLE_WINDOW)
    return {
        part: s / IDLE_WINDOW for part, s in used(before, await snapshot(system.parts())).items()
    }


async def _compare(found: Services, args: argparse.Namespace, broker_kind: str | None) -> str:
    scratch = Scratch(found)
    admin = await asyncpg.connect(found.database_url)
    broker = listener_pid(int(found.kafka_bootstrap.rsplit(":", 1)[1]))
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        async with running_ledger(scratch, "peers") as running:
            pg = await asyncpg.connect(
                found.database_url, server_settings={"search_path": f'"{running.schema}"'}
            )
            restate, dbos = Restate(), Dbos(found.database_url, admin)
            every: list[System] = [
                Toolledger(running, pg, broker),
                ToolledgerPipelined(running, pg, broker),
                ToolledgerLeader(running, pg, broker),
                ToolledgerLeaderPipelined(running, pg, broker),
                restate,
                dbos,
            ]
            systems = [s for s in every if not args.only or s.name in args.only]
            peers = [s for s in (restate, dbos) if s in systems]
            try:
                for peer in peers:
                    say(f"starting {peer.name}")
                    await peer.start()
                for system in systems:
                    say(f"warming up {system.name}")
                    await system.serial(20, "warm")
                    await system.added(2, "warm")
                    await system.concurrent(args.runs, 2, "warm")
                idle = {s.name: await _idle(s) for s in systems}
                rounds: dict[str, list[Round]] = {s.name: [] for s in systems}
                for n in range(args.rounds):
                    shift = n % len(systems)
                    for system in systems[shift:] + systems[:shift]:
                        result = await _round(system, n, args)
                        rounds[system.name].append(result)
                        nap = (
                            ""
                            if result.added is None
                            else f", 50 ms tool +{result.added * 1000:.2f} ms (floor "
                            f"{(result.added_floor or 0) * 1000:.2f} ms)"
                        )
                        say(
                            f"  round {n + 1}/{args.rounds} {system.name}: serial p50 "
                            f"{result.p50 * 1000:.2f} ms, {result.rate:,.0f} steps/s{nap}"
                        )
                checks = [f"{s.name}: {await s.verify()}" for s in systems]
            finally:
                for peer in peers:
                    await peer.close()
                await pg.close()
    finally:
        await scratch.cleanup()
        await admin.close()
    note = (
        f"toolledger on {args.kafka if broker_kind is None else broker_kind}; "
        f"{args.rounds} rounds; serial: {args.samples} steps per round; concurrent: {args.runs} "
        f"runs x {args.calls} steps; load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end; {time.monotonic() - started:.0f} s"
    )
    return render(systems, rounds, idle, checks, note, median)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    problem = _procs.installed() if not args.only or set(args.only) & set(PEERS) else None
    if problem is not None:
        print(f"python -m benchmarks.peers: {problem}", file=sys.stderr)
        return 2
    given = os.environ.get(KAFKA_BOOTSTRAP_ENV)
    with services(args.kafka) as found:
        say(f"services: PostgreSQL {found.database_url}, Kafka {found.kafka_bootstrap}")
        try:
            print(asyncio.run(_compare(found, args, "the broker given" if given else None)))
        except asyncio.CancelledError:
            say("stopped; cleaned up")
            return 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
