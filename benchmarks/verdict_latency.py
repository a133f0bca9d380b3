"""Verdict latency: `LedgerCommands.append_and_await` of a reservation, against its floor.

Sequential reservations of new keys, partitions=2, measured twice: with the projector in the
caller's process (`LedgerStack.connect(settings, run_projector=True)`, as the earlier informal
figure was taken), and with the projector in its own `toolledger projector` process, as
production runs it. In-process, the caller's event loop also carries the projector's Kafka
consumer, its fetch every few milliseconds and its facts producer, and on this machine every
socket write costs a fraction of a millisecond, so the two placements differ.

The floor is what no implementation of "append, then await a durable verdict" can avoid, each
part measured in the same run, interleaved with the measurement:

- produce: `KafkaLog.append` of an event of the same size, from call to acknowledgement;
- produce-to-consumer: from that acknowledgement to a reader that fetches in a loop with the
  projector's fetch wait holding the record (the broker part of the path a record takes to the
  projector; counting from the acknowledgement, not from the send, keeps the floor strict);
- commit: one PostgreSQL round trip of a tiny INSERT in autocommit, committed the way the
  projector commits its batches (without waiting for the WAL flush unless
  `TOOLLEDGER_PROJECTOR_SYNCHRONOUS_COMMIT` is on; docs/architecture.md, "The projector").

Samples are paced by a random pause of up to the fetch wait, so neither the floor nor the
measurement falls into step with the reader's fetch cycle. Every reservation is of a new key and
must be accepted; a rejected one stops the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import asyncpg

from benchmarks._support import (
    Row,
    Scratch,
    ensure_ledger,
    median,
    percentile,
    say,
    start_process,
    stop_process,
)
from toolledger.events.codec import encode
from toolledger.events.kafka import KafkaLog
from toolledger.events.log import LogReader
from toolledger.events.models import CallReserved, args_digest, call_key
from toolledger.events.records import Verdict
from toolledger.wiring.stack import LedgerStack

PARTITIONS = 2
WARMUP = 50
#: The first verdict waits for a projector process to start and take its partitions.
STARTUP_TIMEOUT = 60.0


def reservation(n: int) -> CallReserved:
    run_id = f"lat{n:07d}"
    now = datetime.now(UTC)
    arguments = '{"amount_cents":500,"customer":"c-42"}'
    return CallReserved(
        key=call_key(run_id, "c1"),
        run_id=run_id,
        tool_call_id="c1",
        tenant_id="acme",
        tool="billing.issue_credit",
        effect="external",
        args_digest=args_digest({"amount_cents": 500, "customer": "c-42"}),
        arguments_json=arguments,
        deadline=now + timedelta(seconds=30),
    )


@dataclass
class _Receipts:
    """Records a reader got, by value, with the time they arrived."""

    arrived: dict[bytes, float] = field(default_factory=dict)
    wanted: dict[bytes, asyncio.Future[float]] = field(default_factory=dict)

    async def follow(self, reader: LogReader, fetch_wait: float) -> None:
        while True:
            for records in (await reader.fetch(fetch_wait)).values():
                now = time.perf_counter()
                for record in records:
                    fut = self.wanted.pop(record.value, None)
                    if fut is not None and not fut.done():
                        fut.set_result(now)


@dataclass
class _Samples:
    produce: list[float] = field(default_factory=list)
    delivery: list[float] = field(default_factory=list)
    end_to_end: list[float] = field(default_factory=list)
    commit: list[float] = field(default_factory=list)
    verdict: list[float] = field(default_factory=list)


Placement = Literal["in-process", "process"]


async def measure(
    scratch: Scratch,
    *,
    samples: int,
    repeat: int,
    placements: Sequence[Placement] = ("in-process", "process"),
) -> list[Row]:
    rows: list[Row] = []
    for placement in placements:
        rows += await _measure(scratch, placement, samples=samples, repeat=repeat)
    return rows


async def _measure(
    scratch: Scratch, placement: Placement, *, samples: int, repeat: int
) -> list[Row]:
    schema = scratch.schema("latency")
    topics = scratch.topics(f"latency-{placement}")
    settings = scratch.settings(schema, topics, partitions=PARTITIONS)
    fetch_wait = settings.fetch_wait_ms / 1000
    await ensure_ledger(settings)
    stack = await LedgerStack.connect(settings, run_projector=placement == "in-process")
    floor_log = KafkaLog(
        scratch.services.kafka_bootstrap, f"{topics}floor", client_id="toolledger-bench"
    )
    await floor_log.start()
    commit_mode = "on" if settings.projector_synchronous_commit else "off"
    conn = await asyncpg.connect(
        scratch.services.database_url,
        server_settings={"search_path": f'"{schema}"', "synchronous_commit": commit_mode},
    )
    reader = floor_log.reader()
    receipts = _Receipts()
    follower: asyncio.Task[None] | None = None
    projector: asyncio.subprocess.Process | None = None
    counter = iter(range(10**9))
    home = Path(tempfile.mkdtemp(prefix="toolledger-bench-"))
    try:
        if placement == "process":
            env = scratch.env(schema, topics, partitions=PARTITIONS)
            projector = await start_process(
                ["-m", "toolledger", "projector", "--status-every", "3600"],
                env,
                home / "projector.log",
            )
        await floor_log.ensure_topic(PARTITIONS)
        await reader.assign(dict.fromkeys(range(PARTITIONS), 1))
        follower = asyncio.create_task(receipts.follow(reader, fetch_wait))
        await conn.execute("CREATE TABLE bench_commit (n bigint)")
        await _reserve(stack, reservation(next(counter)), STARTUP_TIMEOUT)
        for _ in range(WARMUP):
            await _reserve(stack, reservation(next(counter)), 10)
        per_rep: list[_Samples] = []
        for rep in range(repeat):
            s = _Samples()
            for _ in range(samples):
                await _floor_sample(floor_log, receipts, conn, next(counter), s)
                await _pause(fetch_wait)
                event = reservation(next(counter))
                started = time.perf_counter()
                verdict = await stack.commands.append_and_await(event, 10)
                s.verdict.append(time.perf_counter() - started)
                _accepted(event, verdict)
                await _pause(fetch_wait)
            per_rep.append(s)
            p50 = percentile(s.verdict, 50) * 1000
            say(f"  latency ({placement}) {rep + 1}/{repeat}: p50 {p50:.2f} ms")
    finally:
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        if projector is not None:
            await stop_process(projector)
        await reader.close()
        await floor_log.close()
        await conn.close()
        await stack.close()
        shutil.rmtree(home, ignore_errors=True)
    return _rows(placement, per_rep, samples, fetch_wait)


def _accepted(event: CallReserved, verdict: Verdict) -> None:
    """Every reservation is of a new key, so each must be accepted: a rejection is a fast
    verdict that measured the wrong thing."""
    if not verdict.accepted:
        raise RuntimeError(f"the reservation of {event.key} was rejected: {verdict.detail}")


async def _reserve(stack: LedgerStack, event: CallReserved, timeout: float) -> None:
    _accepted(event, await stack.commands.append_and_await(event, timeout))


async def _floor_sample(
    log: KafkaLog,
    receipts: _Receipts,
    conn: asyncpg.Connection[asyncpg.Record],
    n: int,
    s: _Samples,
) -> None:
    value = encode(reservation(n))
    arrived = asyncio.get_running_loop().create_future()
    receipts.wanted[value] = arrived
    started = time.perf_counter()
    await log.append(f"lat{n:07d}", value)
    acked = time.perf_counter()
    received = await asyncio.wait_for(arrived, 10)
    s.produce.append(acked - started)
    s.delivery.append(max(received - acked, 0.0))
    s.end_to_end.append(received - started)
    await _pause(0.001)
    started = time.perf_counter()
    await conn.execute("INSERT INTO bench_commit (n) VALUES ($1)", n)
    s.commit.append(time.perf_counter() - started)


async def _pause(up_to: float) -> None:
    await asyncio.sleep(random.uniform(0, up_to))


def _rows(
    placement: Placement, per_rep: list[_Samples], samples: int, fetch_wait: float
) -> list[Row]:
    def p(values: list[float], q: float) -> float:
        return percentile(values, q) * 1000

    produce = median([p(s.produce, 50) for s in per_rep])
    delivery = median([p(s.delivery, 50) for s in per_rep])
    commit = median([p(s.commit, 50) for s in per_rep])
    end_to_end = median([p(s.end_to_end, 50) for s in per_rep])
    floor = produce + delivery + commit
    where = (
        "in the caller's process"
        if placement == "in-process"
        else "a `toolledger projector` process"
    )
    note = (
        f"projector {where}, partitions={PARTITIONS}, fetch wait {fetch_wait * 1000:g} ms, "
        f"{samples} samples x {len(per_rep)} repetitions (medians of per-repetition "
        f"percentiles); floor = produce {produce:.2f} + produce-to-consumer {delivery:.2f} + "
        f"commit {commit:.2f} ms (send-to-consumer p50: {end_to_end:.2f} ms)"
    )
    name = f"verdict latency ({placement})"
    return [
        Row(
            name,
            "p50",
            median([p(s.verdict, 50) for s in per_rep]),
            "ms",
            floor,
            "floor",
            "p50 <= 1.5x",
            note,
        ),
        Row(name, "p99", median([p(s.verdict, 99) for s in per_rep]), "ms", floor, "floor"),
    ]
