"""Projection catch-up: `toolledger projector` applying a backlog, vs raw consume of the same log.

The projector runs as it does in production: a `python -m toolledger projector` process with
its settings in `TOOLLEDGER_*` variables, publishing facts, into a fresh schema. Its rate is
read from PostgreSQL (the committed `projection_offsets`), from the first commit seen to the last,
so process start-up and imports are not counted. The floor is a `KafkaLog` reader consuming the
same partitions of the same topic as fast as it can, decoding nothing.

Four variants: the shipped command; two of them with `TOOLLEDGER_PROJECTOR_OWNERSHIP=share`
(the partitions split between them); one process without facts publishing (what the projection
itself costs); and two processes with half the partitions each, facts off
(`benchmarks._projector_proc`, which takes the partitions it is given). Each run stops
when the backlog is applied or `budget` seconds after its first commit, whichever comes first,
so a slow variant cannot make `make bench` take forever; the rate says over how many events it
was measured. Each run then checks the rows behind the offsets (`_check_rows`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from benchmarks._backlog import Backlog
from benchmarks._support import Row, Scratch, median, say, start_process, stop_process
from toolledger.events.kafka import KafkaLog

POLL = 0.01
STARTUP_TIMEOUT = 60.0
_OFFSETS = "SELECT partition, next_offset FROM projection_offsets"
_ROWS = (
    "SELECT (SELECT coalesce(sum(next_offset - 1), 0) FROM projection_offsets) AS applied, "
    "(SELECT coalesce(array_agg(ARRAY[partition, next_offset]), '{}') FROM projection_offsets) "
    "AS offsets, "
    "(SELECT count(*) FROM tool_execution_history) AS history, "
    "(SELECT count(*) FROM verdicts) AS verdicts, "
    "(SELECT count(*) FROM verdicts WHERE NOT accepted) AS rejected, "
    "(SELECT count(*) FROM tool_executions) AS keys, "
    "(SELECT count(*) FROM tool_executions WHERE status = 'completed') AS completed"
)
_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        # Fields after the command name, which is in parentheses and may hold spaces.
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def raw_consume(scratch: Scratch, backlog: Backlog, max_records: int = 10_000) -> float:
    """Events/s of a bare `KafkaLog` reader over the backlog (the epoch markers skipped)."""
    log = KafkaLog(scratch.services.kafka_bootstrap, backlog.topic, client_id="toolledger-bench")
    await log.start()
    reader = log.reader()
    try:
        position = {p: 1 for p, end in backlog.targets.items() if end > 1}
        await reader.assign(position)
        count = 0
        started = time.perf_counter()
        while position:
            for partition, records in (await reader.fetch(0.2, max_records)).items():
                count += len(records)
                position[partition] = records[-1].offset + 1
                if position[partition] >= backlog.targets[partition]:
                    del position[partition]
                    await reader.assign(position)
        elapsed = time.perf_counter() - started
    finally:
        await reader.close()
        await log.close()
    return count / elapsed


@dataclass(frozen=True)
class Variant:
    """How the backlog is projected: which command, how many processes."""

    name: str
    processes: int = 1
    facts: bool = True
    shipped: bool = False

    def commands(self, partitions: int) -> list[list[str]]:
        if self.shipped:
            return [["-m", "toolledger", "projector", "--status-every", "3600"]] * self.processes
        extra = [] if self.facts else ["--no-facts"]
        return [
            ["-m", "benchmarks._projector_proc", "--partitions", ",".join(map(str, share)), *extra]
            for share in (range(n, partitions, self.processes) for n in range(self.processes))
        ]


SHIPPED = Variant("`toolledger projector` (facts on)", shipped=True)
NO_FACTS = Variant("1 process, facts off", facts=False)
TWO_NO_FACTS = Variant("2 processes, half the partitions each, facts off", 2, facts=False)
TWO_SHARED = Variant("2 x `toolledger projector`, ownership `share` (facts on)", 2, shipped=True)
#: `--variant` names, in the order a full run measures them.
VARIANTS = {"shipped": SHIPPED, "shared": TWO_SHARED, "no-facts": NO_FACTS, "split": TWO_NO_FACTS}


@dataclass(frozen=True)
class CatchUp:
    """One catch-up run: its rate, the events it covers, and the projectors' CPU per event."""

    rate: float
    applied: int
    cpu_per_event: float


async def projector_catch_up(
    scratch: Scratch, backlog: Backlog, variant: Variant, *, batch_size: int, budget: float
) -> CatchUp:
    """`variant` applying the backlog into a fresh schema: events/s, how many it applied (all of
    them, or as many as `budget` seconds after its first commit allowed), and the CPU time its
    processes spent per event over the same span (less noisy than wall time on a shared
    machine)."""
    schema = scratch.schema("catchup")
    topics = scratch.topics("backlog")
    settings: dict[str, object] = {"partitions": backlog.partitions, "batch_size": batch_size}
    if variant.shipped and variant.processes > 1:
        settings["projector_ownership"] = "share"
    env = scratch.env(schema, topics, **settings)
    procs: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory(prefix="toolledger-bench-") as home:
        log_path = Path(home) / "projector.log"
        try:
            for argv in variant.commands(backlog.partitions):
                procs.append(await start_process(argv, env, log_path))
            result = await _watch(scratch, schema, backlog, procs, log_path, budget)
            for proc in procs:
                await stop_process(proc)
            await _check_rows(scratch, schema, backlog)
            return result
        finally:
            for proc in procs:
                await stop_process(proc)
            await scratch.drop_schema(schema)
            await scratch.delete_topics(f"{topics}toolledger.ledger")


async def _check_rows(scratch: Scratch, schema: str, backlog: Backlog) -> None:
    """The committed offsets are backed by rows (read in one snapshot, the projectors
    stopped): one history entry and one accepted verdict per applied event, and, when the
    whole backlog was applied, one `completed` record per call. Offsets alone would let a
    projector that skipped its writes look fast."""
    conn = await asyncpg.connect(
        scratch.services.database_url, server_settings={"search_path": f'"{schema}"'}
    )
    try:
        row = await conn.fetchrow(_ROWS)
    finally:
        await conn.close()
    assert row is not None
    applied, history, verdicts, rejected = (
        row["applied"],
        row["history"],
        row["verdicts"],
        row["rejected"],
    )
    if not (history == verdicts == applied and rejected == 0):
        raise RuntimeError(
            f"{applied} events applied by the offsets, but {history} history entries and "
            f"{verdicts} verdicts ({rejected} rejected)"
        )
    complete = all(
        row_offset >= backlog.targets[p] for p, row_offset in _offsets(row["offsets"]).items()
    )
    if complete and (row["keys"], row["completed"]) != (backlog.events // 2,) * 2:
        raise RuntimeError(
            f"the whole backlog was applied, but {row['completed']} of {row['keys']} records "
            f"are completed ({backlog.events // 2} calls expected)"
        )


def _offsets(pairs: Sequence[Sequence[int]]) -> dict[int, int]:
    return {int(p): int(o) for p, o in pairs}


async def _watch(
    scratch: Scratch,
    schema: str,
    backlog: Backlog,
    procs: list[asyncio.subprocess.Process],
    log_path: Path,
    budget: float,
) -> CatchUp:
    """Poll the committed offsets until every partition reached its end (or the budget is
    spent); the rate from the first commit seen to the last, the events it covers, and the
    processes' CPU seconds per event between those two moments."""
    conn = await asyncpg.connect(
        scratch.services.database_url, server_settings={"search_path": f'"{schema}"'}
    )
    give_up = time.perf_counter() + STARTUP_TIMEOUT
    first: tuple[float, int, float] | None = None
    try:
        while True:
            for proc in procs:
                if proc.returncode is not None:
                    output = await asyncio.to_thread(log_path.read_text)
                    raise RuntimeError(
                        f"a projector exited with {proc.returncode}:\n{output[-2000:]}"
                    )
            if first is None and time.perf_counter() > give_up:
                raise TimeoutError(f"no projector committed within {STARTUP_TIMEOUT:.0f}s")
            try:
                rows = await conn.fetch(_OFFSETS)
            except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
                rows = []
            now = time.perf_counter()
            offsets = {int(r["partition"]): int(r["next_offset"]) for r in rows}
            applied = sum(offset - 1 for offset in offsets.values())
            if first is None and applied > 0:
                first = (now, applied, sum(process_cpu(p.pid) for p in procs))
            done = offsets and all(offsets.get(p, 1) >= t for p, t in backlog.targets.items())
            if first is not None and (done or now - first[0] >= budget):
                if now == first[0]:
                    raise RuntimeError("the backlog was applied between two polls: make it larger")
                cpu = sum(process_cpu(p.pid) for p in procs) - first[2]
                events = applied - first[1]
                return CatchUp(events / (now - first[0]), applied, cpu / events)
            await asyncio.sleep(POLL)
    finally:
        await conn.close()


async def measure(
    scratch: Scratch,
    backlog: Backlog,
    *,
    repeat: int,
    batch_size: int = 2000,
    budget: float = 10.0,
    variants: Sequence[Variant] = tuple(VARIANTS.values()),
) -> list[Row]:
    consumed: list[float] = []
    rates: dict[Variant, list[float]] = {v: [] for v in variants}
    covered: dict[Variant, list[int]] = {v: [] for v in variants}
    cpu: dict[Variant, list[float]] = {v: [] for v in variants}
    for n in range(repeat):
        consumed.append(await raw_consume(scratch, backlog))
        say(f"  catch-up {n + 1}/{repeat}: raw consume {consumed[-1]:,.0f}/s")
        for variant in variants:
            run = await projector_catch_up(
                scratch, backlog, variant, batch_size=batch_size, budget=budget
            )
            rates[variant].append(run.rate)
            covered[variant].append(run.applied)
            cpu[variant].append(run.cpu_per_event)
            say(
                f"    {variant.name}: {run.rate:,.0f}/s over {run.applied:,} events, "
                f"{run.cpu_per_event * 1e6:.0f} us CPU per event"
            )
    floor = median(consumed)
    rows = []
    for variant in variants:
        applied = min(covered[variant])
        part = "the whole backlog" if applied >= backlog.events else f"{applied:,} events"
        note = (
            f"{backlog.events:,}-event backlog, {backlog.partitions} partitions, batch "
            f"{batch_size}; rate over {part} (budget {budget:g}s from the first commit); "
            f"median of {repeat}; projector CPU {median(cpu[variant]) * 1e6:.0f} us/event"
        )
        goal = ">= 20,000 ev/s and >= 0.25x"
        rows.append(
            Row(
                "catch-up",
                variant.name,
                median(rates[variant]),
                "ev/s",
                floor,
                "raw consume",
                goal,
                note,
            )
        )
    return rows
