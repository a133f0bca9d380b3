"""Replay rate for audits: `replay()` of the backlog into a fresh schema, vs raw consume.

What an auditor runs (`toolledger replay --into SCHEMA`): the whole topic folded from offset 1
with the projector's own code, then the digest of the result. The time covers both, because an
audit is not done before its digest is. The floor is the same raw consume as catch-up's.

Each repetition replays twice more, split across worker processes (`toolledger replay
--processes N`, `replay_in_processes`) with 2 workers and then with one per partition, and
checks that both print the one-process digest. A split replay's time includes starting its
workers; its CPU per event counts theirs (reaped children) with this process's.

Then the same without a schema, what `toolledger replay --verify` does without `--into`: the
fold in memory, in this process and split across 2 workers (`replay_in_memory`), nothing
written, the digest checked against the one-process digest into PostgreSQL.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

from benchmarks._backlog import Backlog
from benchmarks._support import BENCH_KEY, Row, Scratch, median, say
from benchmarks.catch_up import raw_consume
from toolledger.events.kafka import KafkaLog
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import ReplayReport, replay
from toolledger.projections.replay_processes import (
    replay_in_memory,
    replay_in_processes,
    replay_into_memory,
)

#: The worker counts of the split replays, besides one process (0: one per partition).
SPLITS = (2, 0)
#: The process counts of the replays in memory.
IN_MEMORY = (1, 2)


@dataclass(frozen=True)
class _Replay:
    rate: float
    #: Events/s up to the last batch folded (one process only: the digest excluded).
    fold_rate: float | None
    cpu_per_event: float
    digest: str


def _cpu() -> float:
    """CPU seconds of this process and of its children reaped so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def replay_once(scratch: Scratch, backlog: Backlog, processes: int = 1) -> _Replay:
    """One replay of the backlog into a fresh schema, in this process or split across
    `processes` workers, timed with its digest."""
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
        started, cpu = time.perf_counter(), _cpu()
        report: ReplayReport
        if processes == 1:
            report = await replay(log, store, targets=backlog.targets, progress=progress)
        else:
            report = await replay_in_processes(
                log,
                store,
                targets=backlog.targets,
                processes=processes,
                database_url=scratch.services.database_url,
                bootstrap=scratch.services.kafka_bootstrap,
            )
        elapsed, cpu = time.perf_counter() - started, _cpu() - cpu
    finally:
        await store.close()
        await log.close()
        await scratch.drop_schema(schema)
    if report.events != backlog.events:
        raise RuntimeError(f"replay folded {report.events} events of {backlog.events}")
    return _Replay(
        rate=report.events / elapsed,
        fold_rate=report.events / (folded_at - started) if processes == 1 else None,
        cpu_per_event=cpu / report.events,
        digest=report.replay_digest,
    )


async def replay_in_memory_once(scratch: Scratch, backlog: Backlog, processes: int) -> _Replay:
    """One replay of the backlog in memory, in this process or split across workers."""
    log = KafkaLog(scratch.services.kafka_bootstrap, backlog.topic, client_id="toolledger-bench")
    await log.start()
    keys = BENCH_KEY.verify_keys()
    try:
        started, cpu = time.perf_counter(), _cpu()
        if processes == 1:
            store = MemoryLedger(verify_keys=keys)
            report = await replay_into_memory(log, store, targets=backlog.targets)
        else:
            report = await replay_in_memory(
                log,
                verify_keys=keys,
                targets=backlog.targets,
                processes=processes,
                bootstrap=scratch.services.kafka_bootstrap,
            )
        elapsed, cpu = time.perf_counter() - started, _cpu() - cpu
    finally:
        await log.close()
    if report.events != backlog.events:
        raise RuntimeError(f"replay in memory folded {report.events} events of {backlog.events}")
    return _Replay(report.events / elapsed, None, cpu / report.events, report.replay_digest)


def _checked(replay: _Replay, alone: _Replay, how: str) -> str:
    """`replay`'s rate and CPU for the progress line, once its digest is the one-process one."""
    if replay.digest != alone.digest:
        raise RuntimeError(
            f"the replay {how} printed digest {replay.digest}, one process into PostgreSQL "
            f"{alone.digest}"
        )
    return f"{replay.rate:,.0f}/s ({replay.cpu_per_event * 1e6:.0f} us)"


async def measure(scratch: Scratch, backlog: Backlog, *, repeat: int) -> list[Row]:
    splits = list(dict.fromkeys(n or backlog.partitions for n in SPLITS))
    consumed: list[float] = []
    alone: list[_Replay] = []
    split: dict[int, list[_Replay]] = {n: [] for n in splits}
    memory: dict[int, list[_Replay]] = {n: [] for n in IN_MEMORY}
    for n in range(repeat):
        consumed.append(await raw_consume(scratch, backlog))
        alone.append(await replay_once(scratch, backlog))
        line = (
            f"  replay {n + 1}/{repeat}: raw {consumed[-1]:,.0f}/s, replay {alone[-1].rate:,.0f}/s "
            f"({alone[-1].cpu_per_event * 1e6:.0f} us CPU per event)"
        )
        for processes in splits:
            split[processes].append(await replay_once(scratch, backlog, processes))
            line += f", {processes} processes " + _checked(
                split[processes][-1], alone[-1], f"split across {processes} processes"
            )
        for processes in IN_MEMORY:
            memory[processes].append(await replay_in_memory_once(scratch, backlog, processes))
            line += f"; in memory, {processes} process(es) " + _checked(
                memory[processes][-1], alone[-1], f"in memory in {processes} processes"
            )
        say(line)
    floor = median(consumed)

    def cpu(replays: list[_Replay]) -> str:
        return f"CPU {median([r.cpu_per_event for r in replays]) * 1e6:.0f} us/event"

    note = f"{backlog.events:,} events; median of {repeat}; {cpu(alone)}"
    folds = [r.fold_rate for r in alone if r.fold_rate is not None]
    rows = [
        Row("replay", "replay + digest", median([r.rate for r in alone]), "ev/s", floor,
            "raw consume", ">= 25,000 ev/s", note),
        Row("replay", "fold only", median(folds), "ev/s", floor, "raw consume"),
    ]  # fmt: skip
    for processes, replays in split.items():
        speedup = median([s.rate / a.rate for s, a in zip(replays, alone, strict=True)])
        rows.append(
            Row(
                "replay",
                f"{processes} processes",
                median([r.rate for r in replays]),
                "ev/s",
                floor,
                "raw consume",
                ">= 25,000 ev/s",
                f"split across {processes} worker processes, the one-process digest checked; "
                f"{speedup:.2f}x one process (median of per-repetition ratios); {cpu(replays)}",
            )
        )
    for processes, replays in memory.items():
        rows.append(
            Row(
                "replay",
                f"in memory, {processes} process{'es' if processes > 1 else ''}",
                median([r.rate for r in replays]),
                "ev/s",
                floor,
                "raw consume",
                ">= 25,000 ev/s",
                "`toolledger replay --verify` without `--into`: folded in memory, nothing "
                f"written, the digest into PostgreSQL checked; {cpu(replays)}",
            )
        )
    return rows
