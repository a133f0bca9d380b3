"""The systems the peers benchmark compares, behind one small interface, and toolledger's own.

Every system runs the same two workloads on a no-op step: `serial(n)`, one run of `n` steps in
sequence, each timed from its call to its durable result; and `concurrent(runs, calls)`, `runs`
runs at once of `calls` steps each. Each counts the steps it asked for, and `verify` checks at
the end that every one ran exactly once and is durably recorded, so a fast system that skipped
work would fail, not win.

toolledger's side is `Ledger.call` of the runtime benchmarks' no-op external tool, with the
projector a `toolledger projector` process (`benchmarks._runtime.running_ledger`), as in
`benchmarks/runtime_overhead.py` and `benchmarks/throughput.py`. Per call it makes two things
durable: the reservation before the tool runs (its verdict awaited) and the outcome after.
"""

from __future__ import annotations

import asyncio
import os
import time
from abc import ABC, abstractmethod

import asyncpg

from benchmarks._runtime import RUNS, RunningLedger, noop
from benchmarks.peers._cpu import Parts

#: Every key the benchmark makes starts with this, so `verify` counts only its own calls.
PREFIX = "peers"
SETTLE_TIMEOUT = 60.0


class System(ABC):
    """One system under test: its workloads, the processes that do its work, a final check."""

    name: str
    #: What the system makes durable per step, for the table's note.
    durable: str

    def __init__(self) -> None:
        self.asked = 0

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

    def __init__(
        self, running: RunningLedger, pg: asyncpg.Connection[asyncpg.Record], broker: int | None
    ) -> None:
        super().__init__()
        self.running = running
        self.pg = pg
        self.broker = broker
        self.ran_before = RUNS["noop"]

    async def _call(self, run_id: str, n: int) -> None:
        outcome = await self.running.ledger.call(
            noop, run_id=run_id, tool_call_id=f"c{n}", tenant_id="bench", arguments={"n": n}
        )
        if outcome.value != n or outcome.replayed:
            raise RuntimeError(f"{run_id}:c{n} did not run the tool once: {outcome}")

    async def serial(self, n: int, label: str) -> list[float]:
        times: list[float] = []
        for i in range(n):
            started = time.perf_counter()
            await self._call(f"{PREFIX}-{label}", i)
            times.append(time.perf_counter() - started)
        self.asked += n
        return times

    async def concurrent(self, runs: int, calls: int, label: str) -> float:
        async def run(r: int) -> None:
            for c in range(calls):
                await self._call(f"{PREFIX}-{label}-{r}", c)

        started = time.perf_counter()
        await asyncio.gather(*(run(r) for r in range(runs)))
        self.asked += runs * calls
        return time.perf_counter() - started

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
        return int(await self.pg.fetchval(query, f"{PREFIX}-%"))

    async def settle(self) -> None:
        """Outcomes return on Kafka's acknowledgement: wait until the projector applied them."""
        give_up = time.monotonic() + SETTLE_TIMEOUT
        while await self._completed() < self.asked and time.monotonic() < give_up:  # noqa: ASYNC110 -- polls PostgreSQL, no event to wait on
            await asyncio.sleep(0.02)

    async def verify(self) -> str:
        ran = RUNS["noop"] - self.ran_before
        if ran != self.asked:
            raise RuntimeError(f"toolledger: the tool ran {ran} times for {self.asked} calls")
        await self.settle()
        row = await self.pg.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS done, count(*) AS keys "
            "FROM tool_executions WHERE key LIKE $1",
            f"{PREFIX}-%",
        )
        assert row is not None
        history = await self.pg.fetchval(
            "SELECT count(*) FROM tool_execution_history WHERE key LIKE $1", f"{PREFIX}-%"
        )
        if (row["done"], row["keys"], history) != (self.asked, self.asked, 2 * self.asked):
            raise RuntimeError(
                f"toolledger: {row['done']} of {self.asked} calls completed ({row['keys']} keys, "
                f"{history} history entries for {2 * self.asked} expected)"
            )
        return f"{self.asked} calls: the tool ran once each, each completed with 2 history entries"
