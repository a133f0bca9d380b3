"""Does a call cost more as the ledger grows? Rounds of concurrent runs on one ledger.

    python -m benchmarks.ledger_growth [--rounds 5] [--runs 64] [--calls 40] [--maintenance SQL]

Each round drives `--runs` concurrent runs of `--calls` sequential calls of the no-op external
tool through one `Ledger` on Kafka + PostgreSQL (a `toolledger projector` process behind it, as
`benchmarks/throughput.py`), all rounds into the same schema, so round n starts on a ledger
n times the size of the first round's. Nothing maintains the tables between rounds unless
`--maintenance` names a statement to run (`ANALYZE`, `VACUUM`): on a server without autovacuum
(the shared one here) nothing else would. The result is the last round's throughput as a ratio
of the first's (goal: >= 0.9; a query whose plan depends on statistics the new schema lacks
shows as a steady fall, which is how the fifth session's decline was found). While each round
runs, `pg_stat_activity` is sampled every 5 ms and the statements most often seen active are
printed, the poor man's `pg_stat_statements` (which the shared server does not preload).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import time

import asyncpg

from benchmarks._runtime import check_books, noop, running_ledger
from benchmarks._support import Row, Scratch, say, services, table
from toolledger.devstack import Services

GOAL = ">= 0.9x"
ACTIVE = (
    "SELECT regexp_replace(query, '\\s+', ' ', 'g') AS q FROM pg_stat_activity "
    "WHERE state = 'active' AND application_name LIKE ANY($1::text[])"
)


async def _sample(
    dsn: str, pids: list[int], stop: asyncio.Event, seen: collections.Counter[str]
) -> None:
    """Count the statements the sessions of `pids` (by `application_name`) run, every 5 ms."""
    names = [f"toolledger-%-{pid}" for pid in pids]
    conn = await asyncpg.connect(dsn)
    try:
        while not stop.is_set():
            for row in await conn.fetch(ACTIVE, names):
                seen[row["q"][:120]] += 1
            await asyncio.sleep(0.005)
    finally:
        await conn.close()


async def measure(
    found: Services, rounds: int, runs: int, calls: int, maintenance: str | None = None
) -> list[Row]:
    """The rounds on `found`'s services; raises if the ledger's books do not add up after."""
    scratch = Scratch(found)
    try:
        async with running_ledger(scratch, "growth") as running:
            rates: list[float] = []
            for n in range(rounds):
                seen: collections.Counter[str] = collections.Counter()
                stop = asyncio.Event()
                pids = [os.getpid(), running.projector_pid]
                sampler = asyncio.create_task(_sample(running.database_url, pids, stop, seen))

                async def run(r: int, n: int = n) -> None:
                    for i in range(calls):
                        await running.ledger.call(
                            noop,
                            run_id=f"growth-{n}-{r}",
                            tool_call_id=f"c{i}",
                            tenant_id="bench",
                            arguments={"n": i},
                        )

                started = time.perf_counter()
                await asyncio.gather(*(run(r) for r in range(runs)))
                rates.append(runs * calls / (time.perf_counter() - started))
                stop.set()
                await sampler
                say(f"  round {n + 1}/{rounds}: {rates[-1]:,.0f} calls/s; most seen active:")
                for statement, count in seen.most_common(3):
                    say(f"    {count:4d}  {statement}")
                if maintenance:
                    conn = await asyncpg.connect(
                        running.database_url,
                        server_settings={"search_path": f'"{running.schema}"'},
                    )
                    try:
                        await conn.execute(maintenance)
                    finally:
                        await conn.close()
            await check_books(running, "growth-", rounds * runs * calls)
    finally:
        await scratch.cleanup()
    note = (
        f"{rounds} rounds of {runs} runs x {calls} calls into one ledger; per round: "
        + ", ".join(f"{r:,.0f}" for r in rates)
        + f" calls/s; maintenance between rounds: {maintenance or 'none'}"
    )
    return [
        Row(
            "ledger growth (last round / first)",
            "throughput",
            rates[-1],
            "calls/s",
            rates[0],
            "first round",
            GOAL,
            note,
        )
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ledger_growth", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--maintenance", default=None, help="SQL run between rounds (ANALYZE)")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.runs < 1 or args.calls < 1:
        parser.error("--rounds >= 2, --runs >= 1 and --calls >= 1, please")
    with services() as found:
        rows = asyncio.run(measure(found, args.rounds, args.runs, args.calls, args.maintenance))
    print(table(rows))


if __name__ == "__main__":
    main()
