"""What the runtime benchmarks share: a no-op external tool and a `Ledger` on scratch services.

The runtime benchmarks (`runtime_overhead`, `fast_path`, `throughput`) measure `Ledger.call`
itself, so the tool does nothing: whatever a call costs is the ledger's. The pipelined twin
(`noop_pipelined`) and the 50 ms tools (`nap`, `nap_pipelined`, which time themselves) are the
peers benchmark's pipelined rows. The ledger runs as in
production: this process is the runtime (`LedgerStack.connect`, no projector), and the projector
is a `toolledger projector` process of its own, started on a fresh schema and topics and stopped
(by pid) when the benchmark ends. A run's first reservation waits for that process to start and
take its partitions, so `running_ledger` makes one call before it hands the ledger over.
`facts=False` runs `benchmarks._projector_proc --no-facts` instead: the same projector without
publishing facts, to show what publishing costs (a diagnostic, not a configuration).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from benchmarks._support import Scratch, start_process, stop_process
from toolledger import Ledger, ToolContext, Toolset, external
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.wiring.leader import leader_port
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

#: Partitions of the events topic the runtime benchmarks create (see BENCHMARKS.md).
PARTITIONS = 4
#: The first verdict waits for the projector process to start and take its partitions.
STARTUP_TIMEOUT = 60.0
#: How long the projector may take to fold the last outcomes after the last call returned.
SETTLE_TIMEOUT = 60.0

bench = Toolset("bench")
#: How often each benchmark tool ran, so a benchmark can check every call ran it exactly once.
RUNS = {"noop": 0, "noop_pipelined": 0, "nap": 0, "nap_pipelined": 0}
#: How often each tool ran, by (the run_id's part before its first `-`, the tool), so the
#: benchmarks sharing a tool on one ledger (the peers benchmark's paths) count only their own.
RAN_FOR: Counter[tuple[str, str]] = Counter()
#: The idempotency keys the pipelined tools received (their "downstream"), and how often each.
KEYS_SEEN: Counter[str] = Counter()
#: How long each napping tool's call spent in the tool itself, by idempotency key (seconds).
NAPPED: dict[str, float] = {}
#: How long the napping tools nap: "a 50 ms tool".
NAP_S = 0.05


@bench.tool(external())
async def noop(n: int, context: ToolContext) -> int:
    """An external tool with no effect: it returns its argument."""
    RUNS["noop"] += 1
    RAN_FOR[context.run_id.split("-", 1)[0], "noop"] += 1
    return n


@bench.tool(external(pipelined=True))
async def noop_pipelined(n: int, context: ToolContext) -> int:
    """The no-op, pipelined: its downstream only counts the idempotency keys it is sent."""
    RUNS["noop_pipelined"] += 1
    RAN_FOR[context.run_id.split("-", 1)[0], "noop_pipelined"] += 1
    KEYS_SEEN[context.idempotency_key] += 1
    return n


async def _nap(context: ToolContext) -> None:
    started = time.perf_counter()
    await asyncio.sleep(NAP_S)
    NAPPED[context.idempotency_key] = time.perf_counter() - started


@bench.tool(external())
async def nap(n: int, context: ToolContext) -> int:
    """A 50 ms tool (it sleeps), timing itself so a benchmark can subtract the tool's own time."""
    RUNS["nap"] += 1
    RAN_FOR[context.run_id.split("-", 1)[0], "nap"] += 1
    await _nap(context)
    return n


@bench.tool(external(pipelined=True))
async def nap_pipelined(n: int, context: ToolContext) -> int:
    """The 50 ms tool, pipelined (its downstream counts keys, as `noop_pipelined`'s)."""
    RUNS["nap_pipelined"] += 1
    RAN_FOR[context.run_id.split("-", 1)[0], "nap_pipelined"] += 1
    KEYS_SEEN[context.idempotency_key] += 1
    await _nap(context)
    return n


@dataclass
class RunningLedger:
    """A ledger whose projector is a process, and where its schema and topics are."""

    ledger: Ledger
    stack: LedgerStack
    #: The same stack through the partition leaders (`TOOLLEDGER_LEADER=auto`), once they
    #: registered: the fast path (`toolledger.leader`); `ledger` is the direct path. None for
    #: the `--no-facts` projector, which runs no leader.
    fast: Ledger | None
    schema: str
    partitions: int
    projector_pid: int
    database_url: str

    def cpu_seconds(self) -> tuple[float, float | None]:
        """CPU time (user + system) used so far by this process (the runtime) and by the
        projector process (None where /proc cannot tell)."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        return own.ru_utime + own.ru_stime, process_cpu_seconds(self.projector_pid)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` from /proc (Linux), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def running_ledger(
    scratch: Scratch, label: str, *, partitions: int = PARTITIONS, facts: bool = True
) -> AsyncIterator[RunningLedger]:
    """A `Ledger` on a fresh schema and topics, with a `toolledger projector` process behind it,
    warmed up by one call; everything is stopped when the block ends (the schema and topics are
    dropped by `scratch.cleanup`)."""
    schema = scratch.schema(label)
    topics = scratch.topics(label)
    settings = scratch.settings(schema, topics, partitions=partitions)
    home = Path(tempfile.mkdtemp(prefix="toolledger-bench-"))
    stack = await LedgerStack.connect(settings)
    projector: asyncio.subprocess.Process | None = None
    try:
        command = ["-m", "toolledger", "projector", "--status-every", "3600"]
        if not facts:
            command = ["-m", "benchmarks._projector_proc", "--no-facts"]
        projector = await start_process(
            command,
            scratch.env(schema, topics, partitions=partitions),
            home / "projector.log",
        )
        ledger = Ledger.from_stack(stack, verdict_timeout=STARTUP_TIMEOUT)
        await ledger.call(
            noop, run_id="warmup", tool_call_id="c0", tenant_id="bench", arguments={"n": 0}
        )
        fast = None
        if facts:
            fast = Ledger(
                leader_port(StackPort(stack), settings.model_copy(update={"leader": "auto"})),
                verdict_timeout=STARTUP_TIMEOUT,
            )
            await _leaders_registered(fast, partitions)
        yield RunningLedger(
            ledger, stack, fast, schema, partitions, projector.pid, scratch.services.database_url
        )
        await ledger.wait_background(10)
        if fast is not None:
            await fast.wait_background(10)
    finally:
        if projector is not None:
            await stop_process(projector)
        await stack.close()
        shutil.rmtree(home, ignore_errors=True)


async def _leaders_registered(fast: Ledger, partitions: int) -> None:
    """Bounded polling until the projector process registered a leader for every partition
    (it does so as it takes them, right after its first batch or at once)."""
    port = fast.port
    if not isinstance(port, LeaderPort):
        raise RuntimeError(f"the fast path's port is {type(port).__name__}, not a LeaderPort")
    give_up = time.monotonic() + STARTUP_TIMEOUT
    while len([a for a in (await port.directory.leaders()).values() if a]) < partitions:
        if time.monotonic() > give_up:
            raise RuntimeError(f"no leader registered within {STARTUP_TIMEOUT:g}s")
        await asyncio.sleep(0.05)


async def check_books(running: RunningLedger, prefix: str, expected: int) -> None:
    """The ledger's books for the calls whose keys start with `prefix`: exactly `expected` keys,
    each `completed` with two history entries (its reservation and its completion), once the
    projector caught up. Outcomes return on Kafka's acknowledgement, so the last ones may still
    be on their way to the projector when the last call returns."""
    conn = await asyncpg.connect(
        running.database_url,
        server_settings={"search_path": f'"{running.schema}"'},
    )
    try:
        pattern = f"{prefix}%"
        give_up = time.monotonic() + SETTLE_TIMEOUT
        while True:
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE status = 'completed') AS done, count(*) AS keys "
                "FROM tool_executions WHERE key LIKE $1",
                pattern,
            )
            assert row is not None
            if row["done"] >= expected or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.1)
        history = await conn.fetchval(
            "SELECT count(*) FROM tool_execution_history WHERE key LIKE $1", pattern
        )
    finally:
        await conn.close()
    if (row["done"], row["keys"], history) != (expected, expected, 2 * expected):
        raise RuntimeError(
            f"the ledger's books do not match the calls made: {row['done']} of {expected} "
            f"{prefix}* calls completed, {row['keys']} keys, {history} history entries "
            f"(expected {2 * expected})"
        )
