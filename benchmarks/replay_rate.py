"""Replay rate for audits: `replay()` of the backlog into a fresh schema, vs raw consume.

What an auditor runs (`toolledger replay --into SCHEMA`): the whole topic folded from offset 1
with the projector's own code, then the digest of the result. The time covers both, because an
audit is not done before its digest is. The floor is the same raw consume as catch-up's.
"""

from __future__ import annotations

import time

from benchmarks._backlog import Backlog
from benchmarks._support import Row, Scratch, median, say
from benchmarks.catch_up import raw_consume
from toolledger.events.kafka import KafkaLog
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import replay


async def replay_once(scratch: Scratch, backlog: Backlog) -> tuple[float, float, float]:
    """Events/s of one replay into a fresh schema, with and without the final digest, and this
    process's CPU seconds per event for the whole audit (replay runs in this process)."""
    schema = scratch.schema("replay")
    log = KafkaLog(scratch.services.kafka_bootstrap, backlog.topic, client_id="toolledger-bench")
    store = PostgresLedger(scratch.services.database_url, schema)
    await log.start()
    await store.start()
    folded_at = 0.0

    def progress(_done: int, _total: int) -> None:
        nonlocal folded_at
        folded_at = time.perf_counter()

    try:
        started, cpu = time.perf_counter(), time.process_time()
        report = await replay(log, store, targets=backlog.targets, progress=progress)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        await store.close()
        await log.close()
        await scratch.drop_schema(schema)
    if report.events != backlog.events:
        raise RuntimeError(f"replay folded {report.events} events of {backlog.events}")
    return report.events / elapsed, report.events / (folded_at - started), cpu / report.events


async def measure(scratch: Scratch, backlog: Backlog, *, repeat: int) -> list[Row]:
    consumed: list[float] = []
    audits: list[float] = []
    folds: list[float] = []
    cpus: list[float] = []
    for n in range(repeat):
        consumed.append(await raw_consume(scratch, backlog))
        audit, fold, cpu = await replay_once(scratch, backlog)
        audits.append(audit)
        folds.append(fold)
        cpus.append(cpu)
        say(
            f"  replay {n + 1}/{repeat}: raw {consumed[-1]:,.0f}/s, replay {audit:,.0f}/s, "
            f"{cpu * 1e6:.0f} us CPU per event"
        )
    floor = median(consumed)
    note = f"{backlog.events:,} events; median of {repeat}; CPU {median(cpus) * 1e6:.0f} us/event"
    return [
        Row("replay", "replay + digest", median(audits), "ev/s", floor, "raw consume", note=note),
        Row("replay", "fold only", median(folds), "ev/s", floor, "raw consume"),
    ]
