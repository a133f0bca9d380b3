"""The systems the peers benchmark compares, behind one small interface, and toolledger's own.

Every system runs the same two workloads on a no-op step: `serial(n)`, one run of `n` steps in
sequence, each timed from its call to its durable result; and `concurrent(runs, calls)`, `runs`
runs at once of `calls` steps each. Each counts the steps it asked for, and `verify` checks at
the end that every one ran exactly once and is durably recorded, so a fast system that skipped
work would fail, not win.

toolledger's side is `Ledger.call` of the runtime benchmarks' no-op external tool, with the
projector a `toolledger projector` process (`benchmarks._runtime.running_ledger`), as in
`benchmarks/runtime_overhead.py` and `benchmarks/throughput.py`. Per call it makes two things
durable: the reservation before the tool runs and the outcome after. It runs twice, on one
ledger: verdict-first (`Toolledger`, the reservation's verdict awaited before the tool runs)
and pipelined (`ToolledgerPipelined`, the same tool declared `external(pipelined=True)`: the
tool runs once Kafka acknowledged the reservation, its verdict awaited meanwhile). Both also
time a 50 ms tool (`added`): what the ledger adds to a tool that does take time.
"""

from __future__ import annotations

import asyncio
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import asyncpg

from benchmarks._runtime import (
    KEYS_SEEN,
    NAP_S,
    NAPPED,
    RAN_FOR,
    RunningLedger,
    nap,
    nap_pipelined,
    noop,
    noop_pipelined,
)
from benchmarks.peers._cpu import Parts
from toolledger import Tool
from toolledger.events.codec import encode
from toolledger.events.models import RunStarted

SETTLE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Added:
    """Seconds added to serial calls of a 50 ms tool, and the floor measured between them."""

    #: Each call's time less the tool's own.
    times: list[float]
    #: Each time the same round trips took bare: the key's read and the reservation's append
    #: before a 50 ms pause, the outcome's append after it (the pause itself subtracted).
    floors: list[float]


class System(ABC):
    """One system under test: its workloads, the processes that do its work, a final check."""

    name: str
    #: What the system makes durable per step, for the table's note.
    durable: str

    def __init__(self) -> None:
        self.asked = 0
        #: Steps completed so far (counted by the systems whose figures are cut into sixths).
        self.done = 0

    @abstractmethod
    async def serial(self, n: int, label: str) -> list[float]:
        """Seconds per step of one run of `n` steps in sequence."""

    @abstractmethod
    async def concurrent(self, runs: int, calls: int, label: str) -> float:
        """Seconds for `runs` runs at once of `calls` steps each to finish."""

    @abstractmethod
    def parts(self) -> Parts:
        """The processes doing this system's work, by part (for CPU accounting)."""

    @abstractmethod
    async def verify(self) -> str:
        """Raise unless every step asked for ran once and is recorded; say what was checked."""

    async def added(self, n: int, label: str) -> Added | None:
        """What the system adds to each of `n` serial calls of a 50 ms tool (the call's time
        less the tool's own), with its floor, or None if it does not measure that."""
        return None

    async def settle(self) -> None:  # noqa: B027 -- most systems are done when they answer
        """Wait until work the system does after answering is done, so its CPU is counted."""

    async def close(self) -> None:  # noqa: B027 -- systems without processes of their own
        """Stop what this system started (by pid) and drop what it created."""


async def backends(pg: asyncpg.Connection[asyncpg.Record], where: str, *args: object) -> list[int]:
    """Pids of the PostgreSQL server processes serving the sessions `where` selects."""
    rows = await pg.fetch(f"SELECT pid FROM pg_stat_activity WHERE {where}", *args)  # noqa: S608
    return [int(r["pid"]) for r in rows]


class Toolledger(System):
    name = "toolledger"
    durable = "a reservation before the step (verdict awaited) and an outcome after"
    #: Every key of this system's calls starts with this, so `verify` counts only its own.
    prefix = "peers"
    tool: Tool[..., int] = noop
    napper: Tool[..., int] = nap
    #: Whether its calls take the leader fast path (`RunningLedger.fast`) or the direct one.
    leader = False

    def __init__(
        self, running: RunningLedger, pg: asyncpg.Connection[asyncpg.Record], broker: int | None
    ) -> None:
        super().__init__()
        self.running = running
        self.pg = pg
        self.broker = broker
        self.napped = 0

    async def _call(self, tool: Tool[..., int], run_id: str, n: int) -> None:
        ledger = self.running.fast if self.leader else self.running.ledger
        if ledger is None:
            raise RuntimeError(f"{self.name}: this ledger's projector runs no leader")
        outcome = await ledger.call(
            tool, run_id=run_id, tool_call_id=f"c{n}", tenant_id="bench", arguments={"n": n}
        )
        if outcome.value != n or outcome.replayed:
            raise RuntimeError(f"{run_id}:c{n} did not run the tool once: {outcome}")
        self.done += 1

    async def serial(self, n: int, label: str) -> list[float]:
        times: list[float] = []
        for i in range(n):
            started = time.perf_counter()
            await self._call(self.tool, f"{self.prefix}-{label}", i)
            times.append(time.perf_counter() - started)
        self.asked += n
        return times

    async def concurrent(self, runs: int, calls: int, label: str) -> float:
        async def run(r: int) -> None:
            for c in range(calls):
                await self._call(self.tool, f"{self.prefix}-{label}-{r}", c)

        started = time.perf_counter()
        await asyncio.gather(*(run(r) for r in range(runs)))
        self.asked += runs * calls
        return time.perf_counter() - started

    async def added(self, n: int, label: str) -> Added:
        """The first call of a run binds it (verdict-first even when pipelined), so it is made
        before the timed ones, as a run's first step would be. A floor sample follows each
        call."""
        run_id = f"{self.prefix}-{label}-nap"
        await self._call(self.napper, run_id, n)
        marker = encode(
            RunStarted(key=f"floor-{run_id}", run_id=f"floor-{run_id}", tenant_id="bench")
        )
        times: list[float] = []
        floors: list[float] = []
        for i in range(n):
            started = time.perf_counter()
            await self._call(self.napper, run_id, i)
            times.append(time.perf_counter() - started - NAPPED.pop(f"{run_id}:c{i}"))
            floors.append(await self._floor(f"floor-{run_id}", marker))
        self.napped += n + 1
        return Added(times, floors)

    async def _floor(self, run_id: str, data: bytes) -> float:
        """The round trips a 50 ms pipelined call cannot do without, bare: a read of a key, an
        append acknowledged by Kafka, 50 ms, another append (the same record: one event_id,
        applied once)."""
        stack = self.running.stack
        started = time.perf_counter()
        await stack.call_reads.get(f"{run_id}:none")
        await stack.events.append(run_id, data)
        paused = time.perf_counter()
        await asyncio.sleep(NAP_S)
        paused = time.perf_counter() - paused
        await stack.events.append(run_id, data)
        return time.perf_counter() - started - paused

    def parts(self) -> Parts:
        runtime, projector = os.getpid(), self.running.projector_pid
        names = [f"toolledger-%-{runtime}", f"toolledger-%-{projector}"]

        async def me() -> list[int]:
            return [runtime]

        async def proj() -> list[int]:
            return [projector]

        async def postgres() -> list[int]:
            return await backends(self.pg, "application_name LIKE ANY($1::text[])", names)

        async def broker() -> list[int]:
            return [] if self.broker is None else [self.broker]

        return {"runtime": me, "projector": proj, "PostgreSQL": postgres, "broker": broker}

    async def _completed(self) -> int:
        query = "SELECT count(*) FROM tool_executions WHERE key LIKE $1 AND status = 'completed'"
        return int(await self.pg.fetchval(query, f"{self.prefix}-%"))

    async def settle(self) -> None:
        """Outcomes return on Kafka's acknowledgement: wait until the projector applied them."""
        give_up = time.monotonic() + SETTLE_TIMEOUT
        expected = self.asked + self.napped
        while await self._completed() < expected and time.monotonic() < give_up:  # noqa: ASYNC110 -- polls PostgreSQL, no event to wait on
            await asyncio.sleep(0.02)

    async def verify(self) -> str:
        ran = RAN_FOR[self.prefix, self.tool.name.split(".")[1]]
        if ran != self.asked:
            raise RuntimeError(f"{self.name}: the tool ran {ran} times for {self.asked} calls")
        await self.settle()
        expected = self.asked + self.napped
        row = await self.pg.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS done, count(*) AS keys "
            "FROM tool_executions WHERE key LIKE $1",
            f"{self.prefix}-%",
        )
        assert row is not None
        history = await self.pg.fetchval(
            "SELECT count(*) FROM tool_execution_history WHERE key LIKE $1", f"{self.prefix}-%"
        )
        if (row["done"], row["keys"], history) != (expected, expected, 2 * expected):
            raise RuntimeError(
                f"{self.name}: {row['done']} of {expected} calls completed ({row['keys']} keys, "
                f"{history} history entries for {2 * expected} expected)"
            )
        return f"{expected} calls: the tool ran once each, each completed with 2 history entries"


class ToolledgerPipelined(Toolledger):
    name = "toolledger pipelined"
    durable = (
        "a reservation before the step (acknowledged by Kafka; its verdict awaited while the "
        "step runs) and an outcome after"
    )
    prefix = "pipelined"
    tool = noop_pipelined
    napper = nap_pipelined

    async def verify(self) -> str:
        checked = await super().verify()
        seen = [n for key, n in KEYS_SEEN.items() if key.startswith(f"{self.prefix}-")]
        if len(seen) != self.asked + self.napped or set(seen) != {1}:
            raise RuntimeError(
                f"{self.name}: the downstream saw keys {len(seen)} keys, not once each"
            )
        return f"{checked}; the downstream got each key once"


class ToolledgerLeader(Toolledger):
    name = "toolledger leader"
    durable = (
        "a reservation before the step and an outcome after, each appended by the partition's "
        "leader and answered from its memory once Kafka acknowledged it"
    )
    prefix = "leader"
    leader = True


class ToolledgerLeaderPipelined(ToolledgerPipelined):
    name = "toolledger leader pipelined"
    durable = (
        "a reservation before the step (acknowledged through the leader; its verdict awaited "
        "while the step runs) and an outcome after, on the leader fast path"
    )
    prefix = "leaderpipelined"
    leader = True
