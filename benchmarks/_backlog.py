"""The backlog that catch-up, raw consume and replay read: reservations and completions.

Many runs are active at once, as in production, so a batch read from a partition touches many
runs and keys: each run reserves and completes `CALLS_PER_RUN` calls, and the runs of a wave of
`WAVE` runs take turns. The events are appended to Kafka once per benchmark run and read by every
repetition; the positions the appends returned tell where each partition ends (end offsets are
not trusted on the local broker).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaProducer

from benchmarks._support import Scratch, say
from toolledger.events.codec import encode
from toolledger.events.kafka import KafkaLog
from toolledger.events.models import (
    CallCompleted,
    CallReserved,
    Event,
    Producer,
    args_digest,
    call_key,
    canonical_json,
)

CALLS_PER_RUN = 10
WAVE = 400
#: Records sent before waiting for their acknowledgements while the backlog is written.
IN_FLIGHT = 20_000

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PRODUCER = Producer(host="bench-runtime", pid=1)


@dataclass(frozen=True)
class Backlog:
    """An events topic holding `events` requests; `targets` is each partition's end offset."""

    topic: str
    partitions: int
    events: int
    targets: dict[int, int]
    append_rate: float


def events(count: int) -> Iterator[Event]:
    """`count` requests (rounded down to whole calls): a reservation, then its completion."""
    calls = count // 2
    runs = -(-calls // CALLS_PER_RUN)
    clock = T0
    emitted = 0
    for wave_start in range(0, runs, WAVE):
        wave = range(wave_start, min(wave_start + WAVE, runs))
        reservations: dict[int, CallReserved] = {}
        for step in range(CALLS_PER_RUN * 2):
            for n in wave:
                if emitted >= calls * 2:
                    return
                clock += timedelta(microseconds=250)
                run_id = f"run{n:07d}"
                tool_call_id = f"c{step // 2}"
                if step % 2 == 0:
                    arguments = {"customer": f"cus-{n}", "amount_cents": 100 + step}
                    reservations[n] = CallReserved(
                        key=call_key(run_id, tool_call_id),
                        run_id=run_id,
                        tool_call_id=tool_call_id,
                        tenant_id="acme",
                        occurred_at=clock,
                        producer=PRODUCER,
                        tool="billing.issue_credit",
                        effect="external",
                        args_digest=args_digest(arguments),
                        arguments_json=canonical_json(arguments),
                        deadline=clock + timedelta(seconds=30),
                    )
                    yield reservations[n]
                else:
                    r = reservations[n]
                    yield CallCompleted(
                        key=r.key,
                        run_id=run_id,
                        tool_call_id=tool_call_id,
                        tenant_id="acme",
                        occurred_at=clock,
                        producer=PRODUCER,
                        reservation_id=r.reservation_id,
                        result_json=f'{{"credit":"cr-{n}-{step}"}}',
                    )
                emitted += 1


async def build(scratch: Scratch, count: int, partitions: int) -> Backlog:
    """Append `count` events to a topic of this run made by `ensure_topic` (epoch markers).

    The backlog is the input, not what is measured, so it is written with a producer of its
    own tuned for bulk (large batches, a short linger) rather than `KafkaLog.append`; records are
    keyed by run_id and partitioned exactly as `KafkaLog.append` would (murmur2 of the key).
    """
    topic = f"{scratch.topics('backlog')}toolledger.events"
    log = KafkaLog(scratch.services.kafka_bootstrap, topic, client_id="toolledger-bench")
    await log.start()
    try:
        await log.ensure_topic(partitions)
    finally:
        await log.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=scratch.services.kafka_bootstrap,
        client_id="toolledger-bench",
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )
    await producer.start()
    ends: dict[int, int] = {}
    appended = 0
    started = time.perf_counter()
    try:
        sent: list[asyncio.Future[Any]] = []
        for event in events(count):
            sent.append(await producer.send(topic, encode(event), key=event.run_id.encode()))
            if len(sent) >= IN_FLIGHT:
                appended += await _acknowledged(sent, ends)
                sent = []
                if appended % 50_000 < IN_FLIGHT:
                    say(f"  backlog: {appended:,} events appended")
        appended += await _acknowledged(sent, ends)
    finally:
        await producer.stop()
    elapsed = time.perf_counter() - started
    targets = {p: ends.get(p, 0) + 1 for p in range(partitions)}
    return Backlog(topic, partitions, appended, targets, appended / elapsed)


async def _acknowledged(sent: list[asyncio.Future[Any]], ends: dict[int, int]) -> int:
    for metadata in await asyncio.gather(*sent):
        ends[metadata.partition] = max(ends.get(metadata.partition, 0), metadata.offset)
    return len(sent)
