"""CPU time of the processes behind one system, read from /proc, over one phase of a round.

Wall time on a shared two-core machine moves with everybody's load; what a step costs in CPU
moves much less. Each system is a set of processes found by a function (the runtime, the servers,
the PostgreSQL backends serving them, the broker): a `Meter` reads their user + system time at
the start and the end of a phase, by pid. A process that exits mid-phase takes its time with it
and one that starts mid-phase counts in full; the phases run after a warm-up, when every pool is
already open, so neither happens in practice.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from benchmarks._runtime import process_cpu_seconds

#: Which pids make up each part of a system, found afresh at the start and end of a phase.
Parts = Mapping[str, Callable[[], Awaitable[list[int]]]]


@dataclass(frozen=True)
class Snapshot:
    cpu: dict[str, dict[int, float]]


async def snapshot(parts: Parts) -> Snapshot:
    cpu: dict[str, dict[int, float]] = {}
    for name, find in parts.items():
        readings = {pid: process_cpu_seconds(pid) for pid in await find()}
        cpu[name] = {pid: s for pid, s in readings.items() if s is not None}
    return Snapshot(cpu)


def used(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds each part used between the two snapshots."""
    out: dict[str, float] = {}
    for name, now in after.cpu.items():
        then = before.cpu.get(name, {})
        out[name] = sum(s - then.get(pid, 0.0) for pid, s in now.items())
    return out


def listener_pid(port: int) -> int | None:
    """The pid of the local process listening on TCP `port` (None if not found or not ours to
    read): how the broker's process is found when the dev stack did not say."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        return int(proc.name)
    return None
