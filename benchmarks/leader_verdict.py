"""Reservation verdict on the leader fast path, against its floor.

Sequential reservations of new keys through a `LeaderPort`, whose leader runs in a
`toolledger projector` process as in production (partitions=2). The floor is what no leader
design can avoid, each part measured in the same run, interleaved with the measurement:

- one loopback round trip to another process: a frame of the reservation's size sent to an
  echo process (`_ECHO`, stdlib asyncio, the same framing) and its echo read back;
- one acknowledged produce: `KafkaLog.append` of an event of the same size, acks=all.

A whole serial call (`Ledger.call` of a no-op tool, a new key each time) is measured the same
way against the floor of its two durable records: two round trips and two produces. Its
reservation carries the read of its key (`read_or_reserve`), so a call is two requests to the
leader; before that it was three. It is measured twice: as a new run's first call (the leader
reads the run and key from PostgreSQL before the append) and as a later call of one run (a
fresh run's keys are known absent: nothing is read before the append).

The figure is the median over repetitions of each repetition's p50 (and p99), as the other
benchmarks report theirs. A rejected reservation, or one the leader did not answer (the direct
path took it), stops the benchmark: it would have measured something else.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._runtime import noop
from benchmarks._support import Row, Scratch, median, percentile, say, start_process, stop_process
from benchmarks.verdict_latency import reservation
from toolledger import Ledger
from toolledger.events.codec import encode
from toolledger.events.kafka import KafkaLog
from toolledger.leader.runtime_side.frames import Kind, encode_frame, read_frame
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.wiring.leader import leader_port
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

PARTITIONS = 2
WARMUP = 50
#: Requests a new call makes of the leader: the reservation (with the key's read), the outcome.
CALL_REQUESTS = 2
STARTUP_TIMEOUT = 60.0

#: An echo process: answers every frame with the same bytes (prints its port first).
_ECHO = """
import asyncio, sys
async def echo(reader, writer):
    while head := await reader.read(65536):
        writer.write(head)
        await writer.drain()
async def main():
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


@dataclass
class _Samples:
    round_trip: list[float] = field(default_factory=list)
    produce: list[float] = field(default_factory=list)
    verdict: list[float] = field(default_factory=list)
    call: list[float] = field(default_factory=list)
    next_call: list[float] = field(default_factory=list)


async def measure(scratch: Scratch, *, samples: int, repeat: int) -> list[Row]:
    schema = scratch.schema("leader")
    topics = scratch.topics("leader")
    settings = scratch.settings(schema, topics, partitions=PARTITIONS, leader="auto")
    home = Path(tempfile.mkdtemp(prefix="toolledger-bench-"))
    stack = await LedgerStack.connect(settings)
    port = leader_port(StackPort(stack), settings)
    assert isinstance(port, LeaderPort)
    floor_log = KafkaLog(
        scratch.services.kafka_bootstrap, f"{topics}floor", client_id="toolledger-bench"
    )
    await floor_log.start()
    env = scratch.env(schema, topics, partitions=PARTITIONS)
    projector = await start_process(
        ["-m", "toolledger", "projector", "--status-every", "3600"], env, home / "projector.log"
    )
    echo = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ECHO, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    counter = iter(range(10**9))
    ledger = Ledger(port, verdict_timeout=10)
    try:
        assert echo.stdout is not None
        echo_port = int((await asyncio.wait_for(echo.stdout.readline(), 30)).decode())
        reader, writer = await asyncio.open_connection("127.0.0.1", echo_port)
        await floor_log.ensure_topic(PARTITIONS)
        await _leaders_up(port)
        for _ in range(WARMUP):
            await _reserve(port, next(counter))
            await _call(ledger, port, next(counter))
        per_rep: list[_Samples] = []
        for rep in range(repeat):
            s = _Samples()
            for _ in range(samples):
                n = next(counter)
                data = encode(reservation(n))
                started = time.perf_counter()
                writer.write(encode_frame(Kind.APPEND, n & 0xFFFFFFFF, data))
                await writer.drain()
                await read_frame(reader)
                s.round_trip.append(time.perf_counter() - started)
                started = time.perf_counter()
                await floor_log.append(f"lat{n:07d}", data)
                s.produce.append(time.perf_counter() - started)
                s.verdict.append(await _reserve(port, next(counter)))
                s.call.append(await _call(ledger, port, next(counter)))
                s.next_call.append(await _call(ledger, port, next(counter), run_id="serial"))
            per_rep.append(s)
            p50 = percentile(s.verdict, 50) * 1000
            call = percentile(s.call, 50) * 1000
            later = percentile(s.next_call, 50) * 1000
            say(
                f"  leader verdict {rep + 1}/{repeat}: p50 {p50:.2f} ms, serial call {call:.2f} ms "
                f"(a run's first), {later:.2f} ms (a later one)"
            )
        writer.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            echo.kill()
        await echo.wait()
        await ledger.close()
        await port.close()  # settles what the leader answered: before its projector stops
        await stop_process(projector)
        await floor_log.close()
        await stack.close()
        shutil.rmtree(home, ignore_errors=True)
    return _rows(per_rep, samples)


async def _leaders_up(port: LeaderPort) -> None:
    """Bounded polling until the projector process registered its leader for every partition."""
    give_up = time.monotonic() + STARTUP_TIMEOUT
    while len([a for a in (await port.directory.leaders()).values() if a]) < PARTITIONS:
        if time.monotonic() > give_up:
            raise RuntimeError(f"no leader registered within {STARTUP_TIMEOUT:g}s")
        await asyncio.sleep(0.05)


async def _reserve(port: LeaderPort, n: int) -> float:
    """One reservation's seconds to its verdict; it must be accepted, by the leader."""
    event = reservation(n)
    before = port.stats["leader"]
    started = time.perf_counter()
    verdict = await port.append_and_await(event, 10)
    took = time.perf_counter() - started
    if not verdict.accepted or port.stats["leader"] != before + 1:
        raise RuntimeError(f"{event.key}: not an accepted verdict from the leader ({verdict})")
    return took


async def _call(ledger: Ledger, port: LeaderPort, n: int, run_id: str | None = None) -> float:
    """One serial call's seconds to its answer; its reservation and outcome answered by the
    leader, in `CALL_REQUESTS` requests in all. Each call is a new run's first unless `run_id`
    is given: then it is the next call of that run (a new key)."""
    before = port.stats["leader"], port.sent.total()
    started = time.perf_counter()
    outcome = await ledger.call(
        noop,
        run_id=run_id or f"call{n:07d}",
        tool_call_id=f"c{n}" if run_id else "c",
        tenant_id="acme",
        arguments={"n": n},
    )
    took = time.perf_counter() - started
    after = port.stats["leader"], port.sent.total()
    if outcome.status != "completed" or after != (before[0] + 2, before[1] + CALL_REQUESTS):
        raise RuntimeError(f"call {n}: not completed by the leader alone ({port.stats})")
    return took


def _rows(per_rep: list[_Samples], samples: int) -> list[Row]:
    def p(values: list[float], q: float) -> float:
        return percentile(values, q) * 1000

    round_trip = median([p(s.round_trip, 50) for s in per_rep])
    produce = median([p(s.produce, 50) for s in per_rep])
    floor = round_trip + produce
    note = (
        f"leader in a `toolledger projector` process, partitions={PARTITIONS}, {samples} samples "
        f"x {len(per_rep)} repetitions (medians of per-repetition percentiles); floor = "
        f"loopback round trip {round_trip:.2f} + acknowledged produce {produce:.2f} ms"
    )
    name = "reservation verdict (leader)"
    return [
        Row(
            name,
            "p50",
            median([p(s.verdict, 50) for s in per_rep]),
            "ms",
            floor,
            "floor",
            "p50 <= 1.3x",
            note,
        ),
        Row(name, "p99", median([p(s.verdict, 99) for s in per_rep]), "ms", floor, "floor"),
        Row(
            "serial call (leader)",
            "p50",
            median([p(s.call, 50) for s in per_rep]),
            "ms",
            2 * floor,
            "floor",
            "",
            f"Ledger.call of a no-op tool, a new run's first call, {CALL_REQUESTS} leader "
            "requests; floor = 2 x (round trip + produce): its two durable records",
        ),
        Row(
            "later call of a run (leader)",
            "p50",
            median([p(s.next_call, 50) for s in per_rep]),
            "ms",
            2 * floor,
            "floor",
            "",
            "the same, a new key of a run the leader has seen: its reservation reads nothing "
            "from PostgreSQL before the append (a fresh run's keys are known absent)",
        ),
    ]
