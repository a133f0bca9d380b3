"""Overhead per external call: `Ledger.call` of a no-op external tool, vs two verdict round trips.

What a call of a tool that does nothing costs is the ledger's overhead on a side-effecting step:
the fast-path read of its key, the reservation appended and its verdict awaited, the tool, and
its outcome appended; the outcome returns on Kafka's acknowledgement because it lands inside the
reservation's deadline, so a call waits for one verdict, not two. Every call is a new key.

The floor is what a naive "reserve, then record" over the same ledger would wait for: two verdict
round trips, `LedgerCommands.append_and_await` of a reservation of a new key twice in a row, on
the same stack and the same projector process. Floor pairs and calls alternate, each followed by
a random pause of up to the projector's fetch wait, so neither falls into step with its fetch
cycle, and the two see the same machine at the same moments.

Each call's CPU time in this process (`time.process_time` around it: the call's own work and
whatever the process's background tasks did meanwhile, such as the waiter and the Kafka client)
is reported beside its wall time: on a shared machine the wall clock mostly measures the queue
for a core, CPU time much less.

At the end it checks its work: the tool ran once per call, every floor reservation was
accepted, and every call's key is `completed` with its reservation and completion in history.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks._runtime import RUNS, RunningLedger, check_books, noop, running_ledger
from benchmarks._support import Row, Scratch, median, percentile, say
from toolledger.events.models import CallReserved, call_key
from toolledger.runtime.executor import CallIdentity

WARMUP = 30
#: The projector's fetch wait (the default `TOOLLEDGER_FETCH_WAIT_MS`): the pause bound.
FETCH_WAIT = 0.005


@dataclass
class _Samples:
    call: list[float] = field(default_factory=list)
    call_cpu: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)


def floor_reservation(running: RunningLedger, n: int) -> CallReserved:
    """A reservation of a new key, as `Ledger.call` would append it for the no-op tool."""
    ledger = running.ledger
    run_id = f"floor{n}"
    who = CallIdentity(run_id, "c1", "bench", call_key(run_id, "c1"))
    return ledger.protocol.reservation(noop, noop.prepare({"n": n}), who)


async def _round_trip(running: RunningLedger, n: int) -> float:
    event = floor_reservation(running, n)
    started = time.perf_counter()
    verdict = await running.stack.commands.append_and_await(event, 10)
    elapsed = time.perf_counter() - started
    if not verdict.accepted:
        raise RuntimeError(f"the floor's reservation {event.key} was rejected: {verdict.detail}")
    return elapsed


async def _call(running: RunningLedger, n: int) -> tuple[float, float]:
    """The call's wall time and this process's CPU time over it, in seconds."""
    cpu = time.process_time()
    started = time.perf_counter()
    outcome = await running.ledger.call(
        noop, run_id=f"call{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
    )
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if outcome.value != n or outcome.replayed:
        raise RuntimeError(f"call{n}:c1 did not run the tool once: {outcome}")
    return elapsed, cpu


async def _pause() -> None:
    await asyncio.sleep(random.uniform(0, FETCH_WAIT))


async def measure(scratch: Scratch, *, samples: int, repeat: int) -> list[Row]:
    async with running_ledger(scratch, "overhead") as running:
        counter = iter(range(10**9))
        ran = RUNS["noop"]
        for _ in range(WARMUP):
            await _call(running, next(counter))
            await _round_trip(running, next(counter))
        per_rep: list[_Samples] = []
        for rep in range(repeat):
            s = _Samples()
            for _ in range(samples):
                first = await _round_trip(running, next(counter))
                second = await _round_trip(running, next(counter))
                s.floor.append(first + second)
                s.round_trip += [first, second]
                await _pause()
                wall, cpu = await _call(running, next(counter))
                s.call.append(wall)
                s.call_cpu.append(cpu)
                await _pause()
            per_rep.append(s)
            say(
                f"  overhead {rep + 1}/{repeat}: call p50 {percentile(s.call, 50) * 1000:.2f} ms "
                f"(CPU {percentile(s.call_cpu, 50) * 1e6:.0f} us), "
                f"two round trips p50 {percentile(s.floor, 50) * 1000:.2f} ms"
            )
        calls = WARMUP + samples * repeat
        if RUNS["noop"] - ran != calls:
            raise RuntimeError(f"the tool ran {RUNS['noop'] - ran} times for {calls} calls")
        await check_books(running, "call", calls)
    return _rows(per_rep, samples, running.partitions)


def _rows(per_rep: list[_Samples], samples: int, partitions: int) -> list[Row]:
    def p(pick: Callable[[_Samples], list[float]], q: float) -> float:
        return median([percentile(pick(s), q) * 1000 for s in per_rep])

    def calls(s: _Samples) -> list[float]:
        return s.call

    def call_cpus(s: _Samples) -> list[float]:
        return s.call_cpu

    def floors(s: _Samples) -> list[float]:
        return s.floor

    def round_trips(s: _Samples) -> list[float]:
        return s.round_trip

    note = (
        f"no-op external tool, a new key per call; projector: a `toolledger projector` process; "
        f"partitions={partitions}; {samples} calls and {samples} floor pairs x {len(per_rep)} "
        f"repetitions, interleaved (medians of per-repetition percentiles); one verdict round "
        f"trip p50 {p(round_trips, 50):.2f} ms; runtime CPU per call p50 "
        f"{p(call_cpus, 50) * 1000:.0f} us; the p99 row's floor is the floor's p99"
    )
    name = "call overhead (external, no-op)"
    return [
        Row(
            name,
            "p50",
            p(calls, 50),
            "ms",
            p(floors, 50),
            "two verdict round trips",
            "p50 <= 1.5x",
            note,
        ),
        Row(name, "p99", p(calls, 99), "ms", p(floors, 99), "two verdict round trips p99"),
    ]
