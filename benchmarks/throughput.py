"""Throughput: concurrent runs, each calling a no-op external tool in sequence, vs direct SQL.

`runs` tasks in one runtime process each make `calls` sequential `Ledger.call`s of the no-op
external tool, every call a new key: what an agent host with that many runs in flight asks of
the ledger. The projector is a `toolledger projector` process, as in production. The rate is
calls completed over the wall time of the whole round, ramp-up included.

The floor is the least a ledger that keeps one row per key in PostgreSQL could do with no log, no
projector and no verdicts: the same number of tasks, each looping `INSERT ... ON CONFLICT DO
NOTHING` (reserve) then `UPDATE` (record) on a key, through an asyncpg pool, on a table of its
own in the same database. Floor rounds and ledger rounds alternate in every repetition.

After the last round the benchmark checks the ledger's books: the tool ran once per call, and
every key is `completed` with exactly two history entries once the projector caught up.

The note adds the CPU time each call cost the runtime (this process) and the projector process
over the measured rounds (getrusage, /proc): on a shared machine the rate moves with everybody
else's load, what a call costs much less.

A second, diagnostic row repeats the measurement with a projector that does not publish facts
(`benchmarks._projector_proc --no-facts`): on a machine where the runtime, the projector,
PostgreSQL and Kafka share two cores, what the projector spends on facts is throughput lost.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from benchmarks._runtime import PARTITIONS, RUNS, RunningLedger, check_books, noop, running_ledger
from benchmarks._support import Row, Scratch, median, percentile, say

#: The floor's pool: one connection per task, up to this many (the server allows 100 in all,
#: and the tests of other sessions need some).
FLOOR_POOL = 32
GOAL = ">= 3,000 calls/s"
_TABLE = (
    "CREATE TABLE floor_calls (key text PRIMARY KEY, status text NOT NULL, "
    "result_json text, updated_at timestamptz NOT NULL)"
)
_RESERVE = (
    "INSERT INTO floor_calls (key, status, updated_at) VALUES ($1, 'started', now()) "
    "ON CONFLICT (key) DO NOTHING"
)
_RECORD = (
    "UPDATE floor_calls SET status = 'completed', result_json = $2, updated_at = now() "
    "WHERE key = $1"
)


async def _floor_round(
    pool: asyncpg.Pool[asyncpg.Record], runs: int, calls: int, label: str
) -> float:
    async def run(r: int) -> None:
        for c in range(calls):
            key = f"{label}-{r}:c{c}"
            await pool.execute(_RESERVE, key)
            await pool.execute(_RECORD, key, str(c))

    started = time.perf_counter()
    await asyncio.gather(*(run(r) for r in range(runs)))
    return runs * calls / (time.perf_counter() - started)


@dataclass(frozen=True)
class _Round:
    rate: float
    latencies: list[float]
    #: CPU seconds per call over the round: this process (the runtime) and the projector's.
    runtime_cpu: float
    projector_cpu: float | None


async def _ledger_round(running: RunningLedger, runs: int, calls: int, label: str) -> _Round:
    latencies: list[float] = []

    async def run(r: int) -> None:
        for c in range(calls):
            started = time.perf_counter()
            outcome = await running.ledger.call(
                noop,
                run_id=f"{label}-{r}",
                tool_call_id=f"c{c}",
                tenant_id="bench",
                arguments={"n": c},
            )
            latencies.append(time.perf_counter() - started)
            if outcome.value != c or outcome.replayed:
                raise RuntimeError(f"{label}-{r}:c{c} did not run the tool once: {outcome}")

    cpu_before = running.cpu_seconds()
    started = time.perf_counter()
    await asyncio.gather(*(run(r) for r in range(runs)))
    elapsed = time.perf_counter() - started
    runtime_cpu, projector_cpu = running.cpu_seconds()
    n = runs * calls
    return _Round(
        rate=n / elapsed,
        latencies=latencies,
        runtime_cpu=(runtime_cpu - cpu_before[0]) / n,
        projector_cpu=None
        if projector_cpu is None or cpu_before[1] is None
        else (projector_cpu - cpu_before[1]) / n,
    )


async def measure(scratch: Scratch, *, runs: int, calls: int, repeat: int) -> list[Row]:
    """The shipped projector, then (a diagnostic) the same without facts publishing."""
    floor_schema = scratch.schema("floor")
    admin = await asyncpg.connect(scratch.services.database_url)
    await admin.execute(f'CREATE SCHEMA "{floor_schema}"')
    await admin.close()
    size = min(runs, FLOOR_POOL)
    pool = await asyncpg.create_pool(
        scratch.services.database_url,
        min_size=size,
        max_size=size,
        server_settings={"search_path": f'"{floor_schema}"'},
    )
    try:
        await pool.execute(_TABLE)
        shipped = await _variant(scratch, pool, runs, calls, repeat, facts=True)
        no_facts = await _variant(scratch, pool, runs, calls, repeat, facts=False)
    finally:
        await pool.close()
    note = (
        f"{runs} concurrent runs x {calls} sequential calls of the no-op external tool, one "
        f"runtime process; projector: a `toolledger projector` process, partitions="
        f"{PARTITIONS}; floor: {runs} tasks on an asyncpg pool of {size}, alternating with "
        f"the ledger's rounds; per-call latency under this load p50 {shipped.p50:.1f} ms, p99 "
        f"{shipped.p99:.1f} ms; CPU per call {shipped.cpu}; medians of {repeat}"
    )
    diagnostic = (
        "the same, with `benchmarks._projector_proc --no-facts` as the projector: what "
        "publishing facts costs; a diagnostic, not a configuration (facts are part of the "
        f"design); per-call latency p50 {no_facts.p50:.1f} ms; CPU per call {no_facts.cpu}"
    )
    name = f"throughput ({runs} runs)"
    floor_name = "INSERT+UPDATE loop"
    return [
        Row(name, "calls/s", shipped.rate, "calls/s", shipped.floor, floor_name, GOAL, note),
        Row(
            name,
            "no facts (diag.)",
            no_facts.rate,
            "calls/s",
            no_facts.floor,
            floor_name,
            note=diagnostic,
        ),
    ]


@dataclass(frozen=True)
class _Result:
    rate: float
    floor: float
    p50: float
    p99: float
    cpu: str


async def _variant(
    scratch: Scratch,
    pool: asyncpg.Pool[asyncpg.Record],
    runs: int,
    calls: int,
    repeat: int,
    *,
    facts: bool,
) -> _Result:
    """Floor rounds alternating with ledger rounds on one ledger; medians, books checked."""
    label = "throughput" if facts else "nofacts"
    floors: list[float] = []
    rounds: list[_Round] = []
    async with running_ledger(scratch, label, facts=facts) as running:
        await _floor_round(pool, runs, max(calls // 4, 1), f"{label}-warmup")
        await _ledger_round(running, runs, max(calls // 4, 1), "warmup")
        ran = RUNS["noop"]
        for rep in range(repeat):
            floors.append(await _floor_round(pool, runs, calls, f"{label}-{rep}"))
            rounds.append(await _ledger_round(running, runs, calls, f"tp{rep}"))
            say(
                f"  {label} {rep + 1}/{repeat}: ledger {rounds[-1].rate:,.0f} calls/s, "
                f"direct SQL {floors[-1]:,.0f} keys/s"
            )
        if RUNS["noop"] - ran != runs * calls * repeat:
            raise RuntimeError("the tool did not run exactly once per call")
        await check_books(running, "tp", runs * calls * repeat)
    cpu = f"runtime {median([r.runtime_cpu for r in rounds]) * 1e6:.0f} us"
    projector = [r.projector_cpu for r in rounds if r.projector_cpu is not None]
    if projector:
        cpu += f", projector {median(projector) * 1e6:.0f} us"
    return _Result(
        rate=median([r.rate for r in rounds]),
        floor=median(floors),
        p50=median([percentile(r.latencies, 50) * 1000 for r in rounds]),
        p99=median([percentile(r.latencies, 99) * 1000 for r in rounds]),
        cpu=cpu,
    )
