"""Verdict latency: `LedgerCommands.append_and_await` of a reservation, against its floor.

The ledger runs as `LedgerStack.connect(settings, run_projector=True)`: the projector in the
same process as the caller (as the earlier informal figure was taken), partitions=2, sequential
reservations of new keys. The floor is what no implementation of "append, then await a durable
verdict" can avoid, each part measured in the same run, interleaved with the measurement:

- produce: `KafkaLog.append` of an event of the same size, from call to acknowledgement;
- produce-to-consumer: from that acknowledgement to a reader that fetches in a loop with the
  projector's fetch wait holding the record (the broker part of the path a record takes to the
  projector; counting from the acknowledgement, not from the send, keeps the floor strict);
- commit: one PostgreSQL round trip of a tiny INSERT in autocommit (its COMMIT flushes the WAL).

Samples are paced by a random pause of up to the fetch wait, so neither the floor nor the
measurement falls into step with the reader's fetch cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg

from benchmarks._support import Row, Scratch, median, percentile, say
from toolledger.events.codec import encode
from toolledger.events.kafka import KafkaLog
from toolledger.events.log import LogReader
from toolledger.events.models import CallReserved, args_digest, call_key
from toolledger.stack import LedgerStack

PARTITIONS = 2
WARMUP = 50


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
    commit: list[float] = field(default_factory=list)
    verdict: list[float] = field(default_factory=list)


async def measure(scratch: Scratch, *, samples: int, repeat: int) -> list[Row]:
    schema = scratch.schema("latency")
    topics = scratch.topics("latency")
    settings = scratch.settings(schema, topics, partitions=PARTITIONS)
    fetch_wait = settings.fetch_wait_ms / 1000
    stack = await LedgerStack.connect(settings, run_projector=True)
    floor_log = KafkaLog(
        scratch.services.kafka_bootstrap, f"{topics}floor", client_id="toolledger-bench"
    )
    await floor_log.start()
    conn = await asyncpg.connect(
        scratch.services.database_url, server_settings={"search_path": f'"{schema}"'}
    )
    reader = floor_log.reader()
    receipts = _Receipts()
    follower: asyncio.Task[None] | None = None
    counter = iter(range(10**9))
    try:
        await floor_log.ensure_topic(PARTITIONS)
        await reader.assign(dict.fromkeys(range(PARTITIONS), 1))
        follower = asyncio.create_task(receipts.follow(reader, fetch_wait))
        await conn.execute("CREATE TABLE bench_commit (n bigint)")
        for _ in range(WARMUP):
            await stack.commands.append_and_await(reservation(next(counter)), 10)
        per_rep: list[_Samples] = []
        for rep in range(repeat):
            s = _Samples()
            for _ in range(samples):
                await _floor_sample(floor_log, receipts, conn, next(counter), s)
                await _pause(fetch_wait)
                event = reservation(next(counter))
                started = time.perf_counter()
                await stack.commands.append_and_await(event, 10)
                s.verdict.append(time.perf_counter() - started)
                await _pause(fetch_wait)
            per_rep.append(s)
            say(f"  latency {rep + 1}/{repeat}: p50 {percentile(s.verdict, 50) * 1000:.2f} ms")
    finally:
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        await reader.close()
        await floor_log.close()
        await conn.close()
        await stack.close()
    return _rows(per_rep, samples, fetch_wait)


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
    await _pause(0.001)
    started = time.perf_counter()
    await conn.execute("INSERT INTO bench_commit (n) VALUES ($1)", n)
    s.commit.append(time.perf_counter() - started)


async def _pause(up_to: float) -> None:
    await asyncio.sleep(random.uniform(0, up_to))


def _rows(per_rep: list[_Samples], samples: int, fetch_wait: float) -> list[Row]:
    def p(values: list[float], q: float) -> float:
        return percentile(values, q) * 1000

    produce = median([p(s.produce, 50) for s in per_rep])
    delivery = median([p(s.delivery, 50) for s in per_rep])
    commit = median([p(s.commit, 50) for s in per_rep])
    floor = produce + delivery + commit
    note = (
        f"in-process projector, partitions={PARTITIONS}, fetch wait {fetch_wait * 1000:g} ms, "
        f"{samples} samples x {len(per_rep)} repetitions (medians of per-repetition "
        f"percentiles); floor = produce {produce:.2f} + produce-to-consumer {delivery:.2f} + "
        f"commit {commit:.2f} ms"
    )
    goal = "p50 <= 1.5x"
    return [
        Row(
            "verdict latency",
            "p50",
            median([p(s.verdict, 50) for s in per_rep]),
            "ms",
            floor,
            "floor",
            goal,
            note,
        ),
        Row(
            "verdict latency",
            "p99",
            median([p(s.verdict, 99) for s in per_rep]),
            "ms",
            floor,
            "floor",
        ),
    ]
