"""Idle CPU of a quiet stack: what a runtime, a projector and the broker burn doing nothing.

    python -m benchmarks --only idle [--repeat 3] [--idle-baseline REV]
    python -m benchmarks.idle_cpu [--repeat 3] [--seconds 10] [--baseline REV]

A stack that waits for its next tool call should cost next to nothing: an agent spends most of
its life waiting for a model. Each repetition starts, on a fresh schema and topics, a
`toolledger projector` process and a runtime process (`--runtime`: `Ledger.connect()`, one call
to prove the stack answers, then nothing), lets them settle (`SETTLE_S`, longer than the
readers take to back off to their bound), and reads every process's CPU time (user + system,
from /proc) over `--seconds` of wall time: runtime, projector and the broker (the tansu process
listening on the bootstrap port; only a broker on this machine can be counted). The broker's
own CPU with nobody connected is measured first, for reference. Against the goal, 30 ms of CPU
per second of wall time for the three together (issue 25), each runtime placement: the direct
path (`TOOLLEDGER_LEADER=off`, the default) and the fast path (`auto`).

CPU time rather than wall time, because the machine is shared: other work slows these processes
down but does not make them burn more cycles. With `--baseline REV` the same processes run on
the package as it was at `REV` (`benchmarks._baseline.export_tree`), alternating with this tree
repetition by repetition, and each figure is printed against the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from benchmarks._baseline import ROOT, export_tree
from benchmarks._runtime import process_cpu_seconds
from benchmarks._support import Row, Scratch, median, say, services, stop_process, table

#: The goal for runtime + projector + broker together, in ms of CPU per s of wall time.
GOAL_MS_PER_S = 30.0
SECONDS = 10.0
#: Seconds between the runtime's last call and the measurement: the readers back off meanwhile.
SETTLE_S = 5.0
STARTUP_TIMEOUT = 60.0
PARTITIONS = 4
PROCESSES = ("runtime", "projector", "broker")

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
    """The pid of the tansu broker listening on `bootstrap`, if it runs on this machine."""
    wanted = f"tcp://{bootstrap}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"tansu" in argv[0] and wanted.encode() in argv:
                return int(proc.name)
    return None


async def cpu_rates(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU over the next `seconds` of wall time, in ms per s."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    wall = time.monotonic() - started
    return {name: (after[name] - before[name]) * 1000 / wall for name in pids}


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
            stdin=asyncio.subprocess.DEVNULL,
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


async def measure_once(
    scratch: Scratch, tree: Tree, placement: Placement, seconds: float, broker: int | None
) -> dict[str, float]:
    """One quiet stack on `tree`'s package: each process's CPU in ms/s over `seconds`."""
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
        pids = {"runtime": runtime.pid, "projector": projector.pid}
        if broker is not None:
            pids["broker"] = broker
        return await cpu_rates(pids, seconds)
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
) -> list[Row]:
    """Rows per placement: the three processes together against the goal, and each process
    (against the baseline's figure when `baseline` is given)."""
    broker = broker_pid(scratch.services.kafka_bootstrap)
    alone = None
    if broker is not None:
        alone = (await cpu_rates({"broker": broker}, seconds))["broker"]
        say(f"  idle: the broker alone, nobody connected: {alone:.2f} ms/s")
    with tempfile.TemporaryDirectory(prefix="toolledger-baseline-") as tmp:
        trees = [Tree("this tree", None)]
        if baseline is not None:
            trees.insert(0, Tree(baseline, export_tree(baseline, Path(tmp))))
        found: dict[tuple[str, Placement], list[dict[str, float]]] = {}
        for rep in range(repeat):
            order = trees if rep % 2 == 0 else list(reversed(trees))
            for placement in placements:
                for tree in order:
                    rates = await measure_once(scratch, tree, placement, seconds, broker)
                    found.setdefault((tree.name, placement), []).append(rates)
                    shown = ", ".join(f"{n} {v:.1f}" for n, v in rates.items())
                    say(f"  idle ({placement}, {tree.name}) {rep + 1}/{repeat}: {shown} ms/s")
    return _rows(found, trees, placements, seconds, alone)


def _rows(
    found: dict[tuple[str, Placement], list[dict[str, float]]],
    trees: list[Tree],
    placements: Sequence[Placement],
    seconds: float,
    alone: float | None,
) -> list[Row]:
    rows: list[Row] = []
    counted = [p for p in PROCESSES if p != "broker" or alone is not None]
    for placement in placements:
        for tree in trees:
            reps = found[(tree.name, placement)]
            each = {p: median([r[p] for r in reps]) for p in counted}
            total = median([sum(r[p] for p in counted) for r in reps])
            name = f"idle CPU ({placement})" + ("" if tree.path is None else f" at {tree.name}")
            note = (
                f"{' + '.join(counted)}, ms of CPU per s of wall time over {seconds:g} s, "
                f"median of {len(reps)}; split "
                + ", ".join(f"{p} {v:.1f}" for p, v in each.items())
            )
            if alone is not None:
                note += f"; the broker alone, nobody connected: {alone:.1f}"
            if alone is None:
                note += "; the broker is not on this machine, so it is not counted"
            rows.append(Row(name, "all", total, "ms/s", GOAL_MS_PER_S, "goal", "<= 30", note))
            base = None if tree.path is None or len(trees) == 1 else tree.name
            for p, value in each.items():
                floor: float | None = None
                if base is None and len(trees) > 1:
                    floor = median([r[p] for r in found[(trees[0].name, placement)]])
                rows.append(Row(name, p, value, "ms/s", floor, trees[0].name if floor else ""))
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
    try:
        await ledger.call(
            noop,
            run_id=f"idle-{os.getpid()}",
            tool_call_id="c1",
            tenant_id="bench",
            arguments={"n": 1},
        )
        await ledger.wait_background(10)
        print(json.dumps({"from": toolledger.__file__}), flush=True)
        await stop.wait()
    finally:
        await ledger.close()


async def _standalone(args: argparse.Namespace) -> list[Row]:
    with services() as found:
        scratch = Scratch(found)
        try:
            return await measure(
                scratch, repeat=args.repeat, seconds=args.seconds, baseline=args.baseline
            )
        finally:
            await scratch.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle_cpu", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--seconds", type=float, default=SECONDS, help="wall time measured")
    parser.add_argument("--baseline", help="a git revision to compare this tree with")
    parser.add_argument("--runtime", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runtime:
        asyncio.run(_runtime_child())
        return
    print(table(asyncio.run(_standalone(args))))


if __name__ == "__main__":
    main()
