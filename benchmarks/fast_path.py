"""Fast-path replay: `Ledger.call` on a completed key, vs one PostgreSQL primary-key SELECT.

Asking again for a call that completed (a crashed run resumed, a model that repeats itself) must
cost about one read: the key's row, its arguments' digest compared, its result restored to the
tool's return type, and nothing appended to Kafka. The floor is that read alone: an asyncpg
`fetchrow` of the key's row from `tool_executions` by primary key, on a connection of its own
(no pool), alternating with the replays over the same keys.

The keys are made first (real calls of the no-op tool) and the benchmark waits until the
projector has folded all of them. At the end it checks that the replays appended nothing: each
key's history still holds exactly its reservation and its completion, and the tool never ran
again.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from benchmarks._runtime import RUNS, RunningLedger, noop, running_ledger
from benchmarks._support import Row, Scratch, median, percentile, say

#: Keys made before measuring; the replays cycle through them.
KEYS = 200
WARMUP = 100
SETTLE_TIMEOUT = 30.0
_SELECT = "SELECT * FROM tool_executions WHERE key = $1"
_COMPLETED = "SELECT count(*) FROM tool_executions WHERE key LIKE 'fp%' AND status = 'completed'"
_HISTORY = "SELECT count(*) FROM tool_execution_history WHERE key LIKE 'fp%'"


async def _make_keys(running: RunningLedger, conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """`KEYS` completed calls, 16 at a time, then wait until every one is folded."""
    for start in range(0, KEYS, 16):
        await asyncio.gather(
            *(
                running.ledger.call(
                    noop, run_id=f"fp{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
                )
                for n in range(start, min(start + 16, KEYS))
            )
        )
    give_up = time.monotonic() + SETTLE_TIMEOUT
    while await conn.fetchval(_COMPLETED) < KEYS:
        if time.monotonic() > give_up:
            raise TimeoutError(f"the projector did not fold {KEYS} calls in {SETTLE_TIMEOUT:g}s")
        await asyncio.sleep(0.05)


async def _replay(running: RunningLedger, n: int) -> float:
    started = time.perf_counter()
    outcome = await running.ledger.call(
        noop, run_id=f"fp{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
    )
    elapsed = time.perf_counter() - started
    if not outcome.replayed or outcome.value != n:
        raise RuntimeError(f"fp{n}:c1 was not answered from the ledger: {outcome}")
    return elapsed


async def _select(conn: asyncpg.Connection[asyncpg.Record], n: int) -> float:
    started = time.perf_counter()
    row = await conn.fetchrow(_SELECT, f"fp{n}:c1")
    elapsed = time.perf_counter() - started
    if row is None:
        raise RuntimeError(f"fp{n}:c1 has no row")
    return elapsed


async def measure(scratch: Scratch, *, samples: int, repeat: int) -> list[Row]:
    async with running_ledger(scratch, "fastpath") as running:
        conn = await asyncpg.connect(
            scratch.services.database_url, server_settings={"search_path": f'"{running.schema}"'}
        )
        try:
            await _make_keys(running, conn)
            ran = RUNS["noop"]
            for n in range(WARMUP):
                await _replay(running, n % KEYS)
                await _select(conn, n % KEYS)
            replays: list[list[float]] = []
            selects: list[list[float]] = []
            for rep in range(repeat):
                replay: list[float] = []
                select: list[float] = []
                for n in range(samples):
                    select.append(await _select(conn, n % KEYS))
                    replay.append(await _replay(running, n % KEYS))
                replays.append(replay)
                selects.append(select)
                say(
                    f"  fast path {rep + 1}/{repeat}: replay p50 "
                    f"{percentile(replay, 50) * 1000:.3f} ms, SELECT p50 "
                    f"{percentile(select, 50) * 1000:.3f} ms"
                )
            if RUNS["noop"] != ran or await conn.fetchval(_HISTORY) != 2 * KEYS:
                raise RuntimeError("a replay of a completed call ran the tool or appended to Kafka")
        finally:
            await conn.close()

    def p(values: list[list[float]], q: float) -> float:
        return median([percentile(v, q) * 1000 for v in values])

    note = (
        f"{KEYS} completed keys replayed in turn, {samples} replays and {samples} SELECTs x "
        f"{repeat} repetitions, interleaved (medians of per-repetition percentiles); both read "
        "on a connection of their own (the runtime's reads skip the pool)"
    )
    name = "fast-path replay (completed key)"
    return [
        Row(name, "p50", p(replays, 50), "ms", p(selects, 50), "PK SELECT", "<= 2x", note),
        Row(name, "p99", p(replays, 99), "ms", p(selects, 99), "PK SELECT p99"),
    ]
