"""Idle CPU of a quiet stack: what a runtime, a projector and the broker burn doing nothing.

    python -m benchmarks --only idle [--repeat 3] [--idle-baseline REV]
    python -m benchmarks.idle_cpu [--repeat 3] [--seconds 10] [--calls 5] [--baseline REV]

A stack that waits for its next tool call should cost next to nothing: an agent spends most of
its life waiting for a model. Each repetition starts, on a fresh schema and topics, a
`toolledger projector` process and a runtime process (`--runtime`: `Ledger.connect()`, one call
to prove the stack answers, then nothing), lets them settle (`SETTLE_S`, longer than the
readers take to back off to their bound), and reads every process's CPU time (user + system,
from /proc) over `--seconds` of wall time: runtime, projector and the broker (the process
listening on the bootstrap port; only a broker on this machine can be counted). The broker's
own CPU with nobody connected is measured first, for reference. Against the goal, 30 ms of CPU
per second of wall time for the three together (issue 25), each runtime placement: the direct
path (`TOOLLEDGER_LEADER=off`, the default) and the fast path (`auto`).

Quiet must not mean slow to wake: after the measurement the runtime makes `--calls` calls of a
no-op tool, each after `IDLE_PAUSE_S` of silence (long enough for every reader to have backed
off to its bound), and the p50 of their time is the "call after an idle spell" row. On the
direct path it is the append hint's trip that keeps it fast (`toolledger.projections.hints`).

CPU time rather than wall time, because the machine is shared: other work slows these processes
down but does not make them burn more cycles. With `--baseline REV` the same processes run on
the package as it was at `REV` (`benchmarks._baseline.export_tree`), alternating with this tree
repetition by repetition, and each figure is printed against the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg

from benchmarks._baseline import ROOT, export_tree
from benchmarks._runtime import process_cpu_seconds
from benchmarks._support import Row, Scratch, median, say, services, stop_process, table
from benchmarks.peers._cpu import listener_pid

#: The goal for runtime + projector + broker together, in ms of CPU per s of wall time.
GOAL_MS_PER_S = 30.0
SECONDS = 10.0
#: Seconds between the runtime's last call and the measurement: the readers back off meanwhile.
SETTLE_S = 5.0
#: Seconds of silence before each call of the "call after an idle spell" row.
IDLE_PAUSE_S = 2.0
CALLS = 5
STARTUP_TIMEOUT = 60.0
PARTITIONS = 4
PROCESSES = ("runtime", "projector", "broker")
#: Not in the goal's sum (issue 25 counts runtime, projector and broker), but shown.
POSTGRES = "PostgreSQL"

Placement = Literal["direct", "fast path"]
PLACEMENTS: tuple[Placement, ...] = ("direct", "fast path")
#: Numbers each stack's topics apart (one benchmark run makes several).
_STACKS = itertools.count()


@dataclass(frozen=True)
class Tree:
    """Where the processes import `toolledger` from: this tree (`path` None) or a baseline's."""

    name: str
    path: Path | None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (its threads included)."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"cannot read the CPU time of process {pid} from /proc")
    return seconds


def broker_pid(bootstrap: str) -> int | None:
    """The pid of the broker listening on `bootstrap` (Apache Kafka or tansu), if it runs on
    this machine and its sockets are ours to read."""
    return listener_pid(int(bootstrap.split(",")[0].rsplit(":", 1)[1]))


async def cpu_rates(pids: dict[str, Sequence[int]], seconds: float) -> dict[str, float]:
    """Each group of processes' CPU over the next `seconds` of wall time, in ms per s."""

    def used() -> dict[str, float]:
        return {name: sum(map(cpu_seconds, group)) for name, group in pids.items()}

    before = used()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = used()
    wall = time.monotonic() - started
    return {name: (after[name] - before[name]) * 1000 / wall for name in pids}


async def stack_backends(database_url: str, pids: Sequence[int]) -> list[int] | None:
    """The PostgreSQL server processes serving these processes' sessions (toolledger names
    every session `toolledger-<role>-<pid>`), or None when the server is not on this machine."""
    conn = await asyncpg.connect(database_url)
    try:
        names = [f"toolledger-%-{pid}" for pid in pids]
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE ANY($1::text[])", names
        )
    finally:
        await conn.close()
    backends = [int(r["pid"]) for r in rows]
    if any(process_cpu_seconds(pid) is None for pid in backends):
        return None
    return backends


async def _start(
    argv: Sequence[str], env: dict[str, str], tree: Tree, log: Path
) -> asyncio.subprocess.Process:
    """`python <argv>` importing `toolledger` from `tree`, in a session of its own (stopped by
    pid); stdout is a pipe, stderr goes to `log`."""
    path = [str(p) for p in (tree.path, ROOT) if p is not None]
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)},
            cwd=tree.path or ROOT,  # `-m` puts the cwd first on the path
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=out,
            start_new_session=True,
        )


async def _ready(proc: asyncio.subprocess.Process, tree: Tree, log: Path) -> None:
    """Wait for the runtime child's ready line and check where its `toolledger` came from."""
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)
    except TimeoutError:
        line = b""
    if not line:
        raise RuntimeError(f"the idle runtime did not start; see {log}")
    where = str(json.loads(line)["from"])
    if not where.startswith(str(tree.path or ROOT)):
        raise RuntimeError(f"the idle runtime imported toolledger from {where}, not {tree.name}")


async def _calls_after_pauses(runtime: asyncio.subprocess.Process, calls: int) -> list[float]:
    """Ask the runtime child for `calls` calls, each after `IDLE_PAUSE_S` of silence; their
    times in ms."""
    assert runtime.stdin is not None and runtime.stdout is not None
    times: list[float] = []
    for _ in range(calls):
        runtime.stdin.write(f"{IDLE_PAUSE_S}\n".encode())
        await runtime.stdin.drain()
        line = await asyncio.wait_for(runtime.stdout.readline(), IDLE_PAUSE_S + STARTUP_TIMEOUT)
        times.append(float(json.loads(line)["ms"]))
    return times


@dataclass(frozen=True)
class Quiet:
    """What one quiet stack measured: each process's CPU in ms/s, and its calls after pauses."""

    cpu: dict[str, float]
    calls_ms: list[float]


async def measure_once(
    scratch: Scratch,
    tree: Tree,
    placement: Placement,
    seconds: float,
    broker: int | None,
    calls: int,
) -> Quiet:
    """One quiet stack on `tree`'s package: each process's CPU over `seconds`, then `calls`
    calls after idle spells."""
    label = "idle" + ("fast" if placement == "fast path" else "direct")
    schema = scratch.schema(label)
    topics = scratch.topics(f"{label}{next(_STACKS)}")
    env = scratch.env(schema, topics, partitions=PARTITIONS)
    env["TOOLLEDGER_LEADER"] = "auto" if placement == "fast path" else "off"
    env["TOOLLEDGER_VERDICT_TIMEOUT_S"] = str(STARTUP_TIMEOUT)
    home = Path(tempfile.mkdtemp(prefix="toolledger-bench-"))
    procs: list[asyncio.subprocess.Process] = []
    try:
        command = ["-m", "toolledger", "projector", "--status-every", "3600"]
        projector = await _start(command, env, tree, home / "projector.log")
        procs.append(projector)
        runtime = await _start(
            ["-m", "benchmarks.idle_cpu", "--runtime"], env, tree, home / "runtime.log"
        )
        procs.append(runtime)
        await _ready(runtime, tree, home / "runtime.log")
        await asyncio.sleep(SETTLE_S)
        pids: dict[str, Sequence[int]] = {"runtime": [runtime.pid], "projector": [projector.pid]}
        if broker is not None:
            pids["broker"] = [broker]
        database = scratch.services.database_url
        backends = await stack_backends(database, [runtime.pid, projector.pid])
        if backends is not None:
            pids[POSTGRES] = backends
        cpu = await cpu_rates(pids, seconds)
        return Quiet(cpu, await _calls_after_pauses(runtime, calls))
    finally:
        for proc in reversed(procs):
            await stop_process(proc)
        shutil.rmtree(home, ignore_errors=True)


async def measure(
    scratch: Scratch,
    *,
    repeat: int,
    seconds: float = SECONDS,
    baseline: str | None = None,
    placements: Sequence[Placement] = PLACEMENTS,
    calls: int = CALLS,
) -> list[Row]:
    """Rows per placement: the three processes together against the goal, each process, and
    a call after an idle spell (against the baseline's figures when `baseline` is given)."""
    broker = broker_pid(scratch.services.kafka_bootstrap)
    alone = None
    if broker is not None:
        alone = (await cpu_rates({"broker": [broker]}, seconds))["broker"]
        say(f"  idle: the broker alone, nobody connected: {alone:.2f} ms/s")
    with tempfile.TemporaryDirectory(prefix="toolledger-baseline-") as tmp:
        trees = [Tree("this tree", None)]
        if baseline is not None:
            trees.insert(0, Tree(baseline, export_tree(baseline, Path(tmp))))
        found: dict[tuple[str, Placement], list[Quiet]] = {}
        for rep in range(repeat):
            order = trees if rep % 2 == 0 else list(reversed(trees))
            for placement in placements:
                for tree in order:
                    quiet = await measure_once(scratch, tree, placement, seconds, broker, calls)
                    found.setdefault((tree.name, placement), []).append(quiet)
                    shown = ", ".join(f"{n} {v:.1f}" for n, v in quiet.cpu.items())
                    after = median(quiet.calls_ms)
                    say(
                        f"  idle ({placement}, {tree.name}) {rep + 1}/{repeat}: {shown} ms/s; "
                        f"a call after {IDLE_PAUSE_S:g} s idle {after:.1f} ms (p50)"
                    )
    return _rows(found, trees, placements, seconds, alone)


def _rows(
    found: dict[tuple[str, Placement], list[Quiet]],
    trees: list[Tree],
    placements: Sequence[Placement],
    seconds: float,
    alone: float | None,
) -> list[Row]:
    """Per placement and tree: the total against the goal, then each process and the call
    after an idle spell, this tree's against the baseline's (the first tree) when there is one."""
    rows: list[Row] = []
    counted = [p for p in PROCESSES if p != "broker" or alone is not None]

    def figures(tree: Tree, placement: Placement) -> dict[str, float]:
        reps = found[(tree.name, placement)]
        out = {p: median([q.cpu[p] for q in reps]) for p in counted}
        out["all"] = median([sum(q.cpu[p] for p in counted) for q in reps])
        out["call"] = median([t for q in reps for t in q.calls_ms])
        if all(POSTGRES in q.cpu for q in reps):
            out[POSTGRES] = median([q.cpu[POSTGRES] for q in reps])
        return out

    for placement in placements:
        base = figures(trees[0], placement) if len(trees) > 1 else None
        for tree in trees:
            got = figures(tree, placement)
            against = base if tree.path is None else None
            name = f"idle CPU ({placement})" + ("" if tree.path is None else f" at {tree.name}")
            split = ", ".join(f"{p} {got[p]:.1f}" for p in counted)
            note = (
                f"{' + '.join(counted)}, ms of CPU per s of wall time over {seconds:g} s, "
                f"median of {len(found[(tree.name, placement)])}; split {split}"
            )
            if base is not None and against is not None:
                note += f"; {trees[0].name}: {base['all']:.1f}"
            if alone is None:
                note += "; the broker is not on this machine, so it is not counted"
            else:
                note += f"; the broker alone, nobody connected: {alone:.1f}"
            rows.append(Row(name, "all", got["all"], "ms/s", GOAL_MS_PER_S, "goal", "<= 30", note))
            label = trees[0].name if against is not None else ""
            for p in counted:
                floor = None if against is None else against[p]
                rows.append(Row(name, p, got[p], "ms/s", floor, label))
            if POSTGRES in got:
                floor = None if against is None else against.get(POSTGRES)
                rows.append(
                    Row(
                        name,
                        f"{POSTGRES} (not in all)",
                        got[POSTGRES],
                        "ms/s",
                        floor,
                        label if floor is not None else "",
                        note="the server processes of the runtime's and projector's sessions",
                    )
                )
            rows.append(
                Row(
                    name,
                    f"call after {IDLE_PAUSE_S:g} s idle, p50",
                    got["call"],
                    "ms",
                    None if against is None else against["call"],
                    label,
                    note="a no-op tool's `Ledger.call`, each after a pause; median of every call",
                )
            )
    return rows


async def _runtime_child() -> None:
    """A runtime that connects, makes one call, says so on stdout and then waits for SIGTERM."""
    import toolledger
    from benchmarks._runtime import noop

    ledger = await toolledger.Ledger.connect()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    calls = itertools.count()

    async def call() -> None:
        n = next(calls)
        run_id = f"idle-{os.getpid()}-{n}"
        await ledger.call(
            noop, run_id=run_id, tool_call_id="c1", tenant_id="bench", arguments={"n": n}
        )

    try:
        await call()
        await ledger.wait_background(10)
        print(json.dumps({"from": toolledger.__file__}), flush=True)
        asked = asyncio.ensure_future(_serve_calls(call))
        await stop.wait()
        asked.cancel()
    finally:
        await ledger.close()


async def _serve_calls(call: Callable[[], Awaitable[None]]) -> None:
    """The runtime child's side of `_calls_after_pauses`: a pause in seconds per stdin line,
    then one call, its time in ms on stdout."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        await asyncio.sleep(float(line))
        started = time.perf_counter()
        await call()
        print(json.dumps({"ms": (time.perf_counter() - started) * 1000}), flush=True)


async def _standalone(args: argparse.Namespace) -> list[Row]:
    with services() as found:
        scratch = Scratch(found)
        try:
            return await measure(
                scratch,
                repeat=args.repeat,
                seconds=args.seconds,
                baseline=args.baseline,
                calls=args.calls,
            )
        finally:
            await scratch.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle_cpu", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="wall time measured")
    parser.add_argument("--calls", type=int, default=CALLS, help="calls after an idle spell")
    parser.add_argument("--baseline", help="a git revision to compare this tree with")
    parser.add_argument("--runtime", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runtime:
        asyncio.run(_runtime_child())
        return
    print(table(asyncio.run(_standalone(args))))


if __name__ == "__main__":
    main()
