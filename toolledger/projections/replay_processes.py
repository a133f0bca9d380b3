"""Replay across processes: partitions folded by several workers, one digest as if by one.

One process replays at the speed of one core, and most of a replay is Python: decoding, the
fold, and reading the result back for its digest. The partitions of the events topic are
independent in the store (a run's events, and so its calls, all come from the run's partition),
so `replay_in_processes` hands disjoint sets of them to worker processes that fold them into
the same fresh schema at once, as several projectors sharing a ledger would.

The digest must be the very one a one-process replay prints (`ledger_digest`: one SHA-256 over
every call in key order, then every run in run_id order, then the history in log order), or a
split replay could not be compared with anything. SHA-256 cannot be combined from parts, but its
input can be cut into consecutive pieces: once every partition is folded, each worker serialises
a range of the stored calls and of the runs (ranges cut at the keys' quantiles, in code point
order, which is Python's and PostgreSQL's `COLLATE "C"` alike) and the history of its own
partitions, and this process hashes the pieces in order. The serialising, the costly part, is
split; what crosses between processes is a few large byte strings, not one object per row.

Workers are spawned (no fork of a process with an event loop and threads), each opens its own
Kafka reader and PostgreSQL connections, and each exits if this process dies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import heapq
import multiprocessing
import multiprocessing.process
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import cast

import asyncpg

from toolledger.events.fold import (
    HISTORY_MARK,
    RUNS_MARK,
    HistoryEntry,
    call_line,
    dead_letters_mark,
    history_line,
    run_line,
)
from toolledger.events.kafka import KafkaLog
from toolledger.events.log import EventLog, LogError
from toolledger.events.records import CallRecord, RunRecord
from toolledger.events.signing import VerifyKeys
from toolledger.projections.batch_sql import CALL_TYPES, HISTORY_TYPES, RUN_TYPES
from toolledger.projections.gc_pause import gc_paused
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.migrations import quote_ident
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import (
    Progress,
    ReplayReport,
    bind_empty,
    fold_partitions,
    replay,
)

#: Seconds between two looks at the target's offsets, for progress.
PROGRESS_INTERVAL = 0.5


def _columns(names: Iterable[str]) -> str:
    return ", ".join(quote_ident(c) for c in names)


def _in_range(column: str) -> str:
    """A filter on `column` for a range of its values, bounds $1 (or NULL: none) to $2."""
    c = f'{quote_ident(column)} COLLATE "C"'
    return f"($1::text IS NULL OR {c} >= $1) AND ($2::text IS NULL OR {c} < $2)"


# Built from batch_sql's constant column names only, never from input (hence S608).
_CALLS = f"SELECT {_columns(CALL_TYPES)} FROM tool_executions WHERE {_in_range('key')}"  # noqa: S608
_RUNS = f"SELECT {_columns(RUN_TYPES)} FROM runs WHERE {_in_range('run_id')}"  # noqa: S608
_HISTORY = (
    f"SELECT {_columns(HISTORY_TYPES)} FROM tool_execution_history "  # noqa: S608
    'WHERE partition = ANY($1::int[]) ORDER BY partition, "offset"'
)
_QUANTILES = 'SELECT percentile_disc($1::float8[]) WITHIN GROUP (ORDER BY {} COLLATE "C") FROM {}'
_DEAD_LETTERS = "SELECT count(*) FROM dead_letters"
_FOLDED = "SELECT coalesce(sum(next_offset - 1), 0) FROM projection_offsets"

Bounds = tuple[str | None, str | None]


@dataclass(frozen=True)
class Share:
    """One worker's part of a replay, in plain values (it crosses to a spawned process)."""

    database_url: str
    bootstrap: str
    topic: str
    schema: str
    verify_keys: dict[str, bytes]
    #: The partitions it folds (to their targets), and whose history it serialises.
    targets: dict[int, int]
    batch_size: int = 5000
    #: The ranges of call keys and run_ids it serialises for the digest, set once all is folded.
    calls: Bounds = (None, None)
    runs: Bounds = (None, None)


@dataclass(frozen=True)
class DigestPart:
    """A worker's serialised rows, as `ledger_digest` hashes them: its range of calls and of
    runs, and the history of each of its partitions."""

    calls: bytes
    runs: bytes
    history: dict[int, bytes]


def split(targets: dict[int, int], processes: int) -> list[dict[int, int]]:
    """The partitions to fold (those with events) in at most `processes` groups of about equal
    events: the largest partition first, each to the group with the fewest events so far."""
    groups: list[dict[int, int]] = [{} for _ in range(processes)]
    load = [0] * processes
    for partition in sorted(
        (p for p, t in targets.items() if t > 1), key=lambda p: (-targets[p], p)
    ):
        least = min(range(processes), key=lambda g: (load[g], g))
        groups[least][partition] = targets[partition]
        load[least] += targets[partition] - 1
    return [g for g in groups if g] or [{}]


async def replay_in_processes(
    log: EventLog,
    into: PostgresLedger,
    *,
    targets: dict[int, int],
    processes: int,
    database_url: str,
    bootstrap: str,
    progress: Progress | None = None,
    batch_size: int = 5000,
) -> ReplayReport:
    """`replay` with the partitions folded by up to `processes` worker processes into `into`
    (a fresh schema of the database at `database_url`), the events read from `log`'s topic on
    the Kafka at `bootstrap`. The report, digest included, is the one `replay` gives."""
    identity = await bind_empty(log, into)
    wanted = {p: targets[p] for p in range(identity.partitions) if p in targets}
    groups = split(wanted, max(1, processes))
    shares = [
        Share(
            database_url=database_url,
            bootstrap=bootstrap,
            topic=log.topic,
            schema=into.schema,
            verify_keys=dict(into.verify_keys.raw),
            targets=group,
            batch_size=batch_size,
        )
        for group in groups
    ]
    report = ReplayReport(targets=dict(targets))
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        len(shares), mp_context=context, initializer=_exit_with, initargs=(os.getpid(),)
    ) as pool:
        watching = asyncio.create_task(_report_progress(database_url, into, wanted, progress))
        try:
            folded = await asyncio.gather(
                *(loop.run_in_executor(pool, fold_share, share) for share in shares)
            )
        finally:
            watching.cancel()
        report.events = sum(events for events, _ in folded)
        report.dead_letters = sum(dead for _, dead in folded)
        conn = await _connect(database_url, into.schema)
        try:
            calls = await _ranges(conn, "key", "tool_executions", len(shares))
            runs = await _ranges(conn, "run_id", "runs", len(shares))
            dead_letters = int(await conn.fetchval(_DEAD_LETTERS))
        finally:
            await conn.close()
        ranged = [
            dataclasses.replace(share, calls=c, runs=r)
            for share, c, r in zip(shares, calls, runs, strict=True)
        ]
        parts = await asyncio.gather(
            *(loop.run_in_executor(pool, digest_share, share) for share in ranged)
        )
    report.replay_digest = merged_digest(parts, dead_letters)
    return report


@dataclass(frozen=True)
class MemoryShare:
    """One worker's part of a replay in memory (`replay_in_memory`), in plain values."""

    bootstrap: str
    topic: str
    verify_keys: dict[str, bytes]
    #: The partitions it folds, to their targets.
    targets: dict[int, int]
    batch_size: int = 5000


@dataclass(frozen=True)
class FoldedPart:
    """What a worker folded in memory, as `ledger_digest` hashes it: its calls and runs as
    (key, line) in key order (the parent merges every worker's into one order), and the history
    of each of its partitions."""

    events: int
    dead_letters: int
    calls: list[tuple[str, bytes]]
    runs: list[tuple[str, bytes]]
    history: dict[int, bytes]


async def replay_into_memory(
    log: EventLog,
    store: MemoryLedger,
    *,
    targets: dict[int, int],
    progress: Progress | None = None,
    batch_size: int = 5000,
) -> ReplayReport:
    """`replay` into `store` in this process, with cyclic collection paused throughout (and
    not only per batch, as a projector has it): a memory ledger keeps everything the fold makes,
    so every collection between batches walked all of it again, 10-30% of the replay here.
    For a process that replays and ends (`toolledger replay` without `--into`)."""
    with gc_paused():
        return await replay(log, store, targets=targets, progress=progress, batch_size=batch_size)


async def replay_in_memory(
    log: EventLog,
    *,
    verify_keys: VerifyKeys,
    targets: dict[int, int],
    processes: int,
    bootstrap: str,
    progress: Progress | None = None,
    batch_size: int = 5000,
) -> ReplayReport:
    """`replay` into no store at all: up to `processes` worker processes each fold a share of
    the partitions into a `MemoryLedger` of their own and serialise it, and this process hashes
    their lines in `ledger_digest`'s order. Nothing is written anywhere; the digest is the one
    a replay into a schema prints, for an auditor who only wants to check it. Each worker holds
    its share of the ledger in memory while it folds.

    (One process needs no workers: `replay_into_memory`.)"""
    identity = await bind_empty(log, MemoryLedger(verify_keys=verify_keys))
    wanted = {p: targets[p] for p in range(identity.partitions) if p in targets}
    total = sum(t - 1 for t in wanted.values() if t > 1)
    shares = [
        MemoryShare(bootstrap, log.topic, dict(verify_keys.raw), group, batch_size)
        for group in split(wanted, max(1, processes))
    ]
    loop = asyncio.get_running_loop()

    def told(done: int) -> None:
        if progress is not None:
            progress(done, total)

    def told_from_thread(done: int) -> None:
        loop.call_soon_threadsafe(told, done)

    context = multiprocessing.get_context("spawn")
    workers: list[multiprocessing.process.BaseProcess] = []
    receiving: list[Awaitable[FoldedPart]] = []
    try:
        for share in shares:
            receiver, sender = context.Pipe(duplex=False)
            worker: multiprocessing.process.BaseProcess = context.Process(
                target=_memory_worker,
                args=(share, sender, os.getpid()),
                name="toolledger-replay",
                daemon=True,
            )
            worker.start()
            sender.close()
            workers.append(worker)
            receiving.append(asyncio.to_thread(_received, worker, receiver, told_from_thread))
        parts = await asyncio.gather(*receiving)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            worker.join()
    report = ReplayReport(targets=dict(targets))
    report.events = sum(part.events for part in parts)
    report.dead_letters = sum(part.dead_letters for part in parts)
    report.replay_digest = merged_memory_digest(parts)
    return report


def merged_memory_digest(parts: Sequence[FoldedPart]) -> str:
    """`ledger_digest` of what the workers folded: calls and runs merged into key order."""
    h = hashlib.sha256()
    for _, line in heapq.merge(*(part.calls for part in parts)):
        h.update(line)
    h.update(RUNS_MARK)
    for _, line in heapq.merge(*(part.runs for part in parts)):
        h.update(line)
    h.update(HISTORY_MARK)
    history = {p: text for part in parts for p, text in part.history.items()}
    for partition in sorted(history):
        h.update(history[partition])
    h.update(dead_letters_mark(sum(part.dead_letters for part in parts)))
    return h.hexdigest()


def _received(
    worker: multiprocessing.process.BaseProcess,
    receiver: Connection,
    progress: Callable[[int], None],
) -> FoldedPart:
    """In a thread of this process: a worker's progress, then its part (or its error)."""
    with receiver:
        while True:
            try:
                kind, value = receiver.recv()
            except EOFError:
                worker.join(5.0)
                raise LogError(
                    f"replay worker {worker.pid} ended without an answer (exit code "
                    f"{worker.exitcode})"
                ) from None
            if kind == "progress":
                progress(value)
            elif kind == "failed":
                raise value
            else:
                return cast(FoldedPart, value)


def _memory_worker(share: MemoryShare, sender: Connection, parent: int) -> None:
    """A spawned worker of `replay_in_memory`: fold, send the part, and end at once.

    It never collects cycles (a fold makes almost none, `gc_pause`) and it ends with
    `os._exit` as soon as its part is sent: freeing a ledger's worth of objects one by one, with
    the collections that would set off, took longer than serialising them (1.2 s for 50,000
    events here), and nothing is left to flush (the Kafka reader is closed)."""
    gc.disable()
    _exit_with(parent)
    try:
        # The ledger is held, never freed, until `os._exit`.
        part, _held = asyncio.run(_fold_in_memory(share, lambda n: sender.send(("progress", n))))
        sender.send(("part", part))
    except Exception as exc:  # the parent raises it; a cause it cannot unpickle is said in text
        try:
            sender.send(("failed", exc))
        except Exception:  # an exception that does not pickle
            sender.send(("failed", LogError(f"{type(exc).__name__}: {exc}")))
    sender.close()
    os._exit(0)


async def _fold_in_memory(
    share: MemoryShare, told: Callable[[int], None]
) -> tuple[FoldedPart, MemoryLedger]:
    """The share folded into a new `MemoryLedger` and serialised (the ledger is returned too,
    so that freeing it is the caller's choice)."""
    log = KafkaLog(share.bootstrap, share.topic)
    store = MemoryLedger(verify_keys=VerifyKeys(share.verify_keys))
    await log.start()
    try:
        await bind_empty(log, store)
        events, _ = await fold_partitions(
            log, store, share.targets, batch_size=share.batch_size, progress=lambda n, _: told(n)
        )
    finally:
        await log.close()
    snapshot = await store.snapshot()
    by_partition: dict[int, list[bytes]] = {p: [] for p in share.targets}
    for entry in snapshot.history:
        by_partition[entry.partition].append(history_line(entry))
    part = FoldedPart(
        events=events,
        dead_letters=snapshot.dead_letters,
        calls=sorted((key, call_line(call)) for key, call in snapshot.calls.items()),
        runs=sorted((run_id, run_line(run)) for run_id, run in snapshot.runs.items()),
        history={p: b"".join(lines) for p, lines in by_partition.items()},
    )
    return part, store


def merged_digest(parts: Sequence[DigestPart], dead_letters: int) -> str:
    """`ledger_digest` of the rows the parts hold (in the order of their ranges)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.calls)
    h.update(RUNS_MARK)
    for part in parts:
        h.update(part.runs)
    h.update(HISTORY_MARK)
    history = {p: text for part in parts for p, text in part.history.items()}
    for partition in sorted(history):
        h.update(history[partition])
    h.update(dead_letters_mark(dead_letters))
    return h.hexdigest()


async def _ranges(
    conn: asyncpg.Connection[asyncpg.Record], column: str, table: str, shares: int
) -> list[Bounds]:
    """`shares` consecutive ranges of `column`'s values holding about as many rows each."""
    if shares == 1:
        return [(None, None)]
    fractions = [i / shares for i in range(1, shares)]
    cuts: list[str | None] = list(
        await conn.fetchval(_QUANTILES.format(quote_ident(column), table), fractions) or []
    )
    if len(cuts) != shares - 1 or None in cuts:  # an empty table: one range for everything
        return [(None, None)] + [("", "")] * (shares - 1)
    edges = [None, *cuts, None]
    return [(edges[i], edges[i + 1]) for i in range(shares)]


def fold_share(share: Share) -> tuple[int, int]:
    """In a worker: fold the share's partitions; the events folded and dead letters met."""
    return asyncio.run(_fold_share(share))


def digest_share(share: Share) -> DigestPart:
    """In a worker, once every partition is folded: its share of the rows, serialised."""
    return asyncio.run(_digest_share(share))


async def _fold_share(share: Share) -> tuple[int, int]:
    log = KafkaLog(share.bootstrap, share.topic)
    store = PostgresLedger(
        share.database_url, share.schema, verify_keys=VerifyKeys(share.verify_keys)
    )
    await log.start()
    try:
        await store.start()
        return await fold_partitions(log, store, share.targets, batch_size=share.batch_size)
    finally:
        await store.close()
        await log.close()


async def _digest_share(share: Share) -> DigestPart:
    # As a snapshot is: the rows are gone before collection resumes (`gc_pause`).
    with gc_paused():
        return await _serialised(share)


async def _serialised(share: Share) -> DigestPart:
    conn = await _connect(share.database_url, share.schema)
    try:
        calls = await conn.fetch(_CALLS, *share.calls)
        runs = await conn.fetch(_RUNS, *share.runs)
        history = await conn.fetch(_HISTORY, sorted(share.targets))
    finally:
        await conn.close()
    by_partition: dict[int, list[bytes]] = {p: [] for p in share.targets}
    for entry in (HistoryEntry.model_validate(dict(r)) for r in history):
        by_partition[entry.partition].append(history_line(entry))
    return DigestPart(
        calls=_joined(sorted(_call_lines(calls))),
        runs=_joined(sorted(_run_lines(runs))),
        history={p: b"".join(lines) for p, lines in by_partition.items()},
    )


def _joined(lines: Iterable[tuple[str, bytes]]) -> bytes:
    return b"".join(line for _, line in lines)


def _call_lines(rows: Iterable[asyncpg.Record]) -> Iterator[tuple[str, bytes]]:
    for row in rows:
        call = CallRecord.model_validate(dict(row))
        yield call.key, call_line(call)


def _run_lines(rows: Iterable[asyncpg.Record]) -> Iterator[tuple[str, bytes]]:
    for row in rows:
        run = RunRecord.model_validate(dict(row))
        yield run.run_id, run_line(run)


async def _report_progress(
    database_url: str, into: PostgresLedger, targets: dict[int, int], progress: Progress | None
) -> None:
    """Tell `progress` what the workers folded, from the target's stored offsets."""
    if progress is None:
        return
    total = sum(t - 1 for t in targets.values() if t > 1)
    conn = await _connect(database_url, into.schema)
    told = 0
    try:
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL)
            folded = int(await conn.fetchval(_FOLDED))
            if folded > told:
                progress(folded - told, total)
                told = folded
    finally:
        await conn.close()


async def _connect(database_url: str, schema: str) -> asyncpg.Connection[asyncpg.Record]:
    return await asyncpg.connect(database_url, server_settings={"search_path": quote_ident(schema)})


def _exit_with(parent: int) -> None:
    """A worker's watch on the process that spawned it: a replay nobody reads is stopped."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="toolledger-replay-parent", daemon=True).start()
