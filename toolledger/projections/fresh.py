"""FreshReads: the ledger as people and other processes read it, behind the read barrier.

The operator service (API, console, `toolledger executions`, `testing.Operator`), the processors
and a runtime's own reads of runs and lists read through this, never through the store itself,
so each read first waits for the projection to hold every write acknowledged before it
(`toolledger.projections.barrier`): a call a runtime was told about a moment ago is found, at the
version the runtime was told. Each read covers what it can touch: a key or a run its partition,
a list bounded to a run that run's, any other list every partition. A key's read may be answered
from a partition leader's memory instead (`KeyVouchers`), when the leader gives it as of an end
at least the partition's end the barrier learned: then it needs no wait for the commit, which
lingers behind a leader's answers by design.

`LedgerReads` is what such readers need of it; a `LedgerStore` has the same methods, so a test
may hand a store itself to a reader (and read without the barrier). The projector never reads
through this: it is the writer the barrier waits for.

Two reads pass through unbarriered, on purpose: `call_stats` (the `/metrics` scrape, which must
neither block nor fail while a projection catches up, and which counts, never shows, a call) and
the store's own bookkeeping (`registered_keys`, `partition_state`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol

from toolledger.events.fold import DeadLetter, HistoryEntry
from toolledger.events.records import CallRecord, RunRecord
from toolledger.events.signing import VerifyKeys
from toolledger.port import CallQuery, runs_of_key
from toolledger.projections.barrier import UNBOUND, ReadBarrier
from toolledger.projections.leases import PartitionLease
from toolledger.projections.store import CallStats, LedgerStore, PartitionState, StatusCounts

log = logging.getLogger("toolledger.reads")


class LedgerReads(Protocol):
    """The reads of the ledger an operator, a processor or a runtime's lists make."""

    async def get_call(self, key: str) -> CallRecord | None: ...

    async def get_run(self, run_id: str) -> RunRecord | None: ...

    async def history(self, key: str) -> list[HistoryEntry]: ...

    async def list_calls(self, query: CallQuery) -> list[CallRecord]: ...

    async def list_runs(
        self,
        statuses: Collection[str],
        tenant_id: str | None = None,
        limit: int = 500,
        *,
        resume_failed: bool = False,
    ) -> list[RunRecord]: ...

    async def status_counts(
        self, tenant_id: str | None, deadline_before: datetime
    ) -> StatusCounts: ...

    async def call_stats(self, now: datetime, older_than: Sequence[float]) -> CallStats: ...

    async def dead_letters(self) -> list[DeadLetter]: ...

    async def registered_keys(self) -> VerifyKeys: ...

    async def partition_state(self, partition: int) -> PartitionState | None: ...

    async def partition_leases(self) -> list[PartitionLease]: ...


class KeyVouchers(Protocol):
    """Who may answer a key's read from memory (a partition's leader:
    `toolledger.leader.runtime_side.index.LeaderIndex`)."""

    async def vouched(self, key: str, run_id: str) -> tuple[int, CallRecord | None] | None:
        """(the end of the run's partition in that memory, the key's record as of that end)
        when the memory vouches for the key; None when it does not answer so."""


class FreshReads:
    """`store`'s reads, each after `barrier` waited for what it covers; a key's read answered
    from `vouchers`' memory when that memory reaches the key's partition's end."""

    def __init__(
        self, store: LedgerStore, barrier: ReadBarrier, vouchers: KeyVouchers | None = None
    ) -> None:
        self.store = store
        self.barrier = barrier
        self.vouchers = vouchers
        #: Key reads answered from a leader's memory, for tests and the benchmark.
        self.vouched = 0

    async def get_call(self, key: str) -> CallRecord | None:
        runs = runs_of_key(key)
        if self.vouchers is None or len(runs) != 1:
            await self.barrier.wait(runs)
            return await self.store.get_call(key)
        vouched, look = await asyncio.gather(
            self._vouched(self.vouchers, key, runs[0]), self.barrier.look(runs)
        )
        if vouched is not None and vouched[0] >= max(look.ends.values(), default=UNBOUND):
            self.vouched += 1
            return vouched[1]
        await self.barrier.reach(look)
        return await self.store.get_call(key)

    @staticmethod
    async def _vouched(
        vouchers: KeyVouchers, key: str, run_id: str
    ) -> tuple[int, CallRecord | None] | None:
        try:
            return await vouchers.vouched(key, run_id)
        except Exception as exc:  # an accelerator: the barrier and PostgreSQL answer instead
            log.debug("no record of %s from memory (%s)", key, exc)
            return None

    async def get_run(self, run_id: str) -> RunRecord | None:
        await self.barrier.wait((run_id,))
        return await self.store.get_run(run_id)

    async def history(self, key: str) -> list[HistoryEntry]:
        """A call key's history, or a run_id's own (`LedgerStore.history`)."""
        await self.barrier.wait(runs_of_key(key, may_be_run=True))
        return await self.store.history(key)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        await self.barrier.wait(None if query.run_id is None else (query.run_id,))
        return await self.store.list_calls(query)

    async def list_runs(
        self,
        statuses: Collection[str],
        tenant_id: str | None = None,
        limit: int = 500,
        *,
        resume_failed: bool = False,
    ) -> list[RunRecord]:
        await self.barrier.wait()
        return await self.store.list_runs(statuses, tenant_id, limit, resume_failed=resume_failed)

    async def status_counts(self, tenant_id: str | None, deadline_before: datetime) -> StatusCounts:
        await self.barrier.wait()
        return await self.store.status_counts(tenant_id, deadline_before)

    async def dead_letters(self) -> list[DeadLetter]:
        await self.barrier.wait()
        return await self.store.dead_letters()

    async def call_stats(self, now: datetime, older_than: Sequence[float]) -> CallStats:
        return await self.store.call_stats(now, older_than)

    async def registered_keys(self) -> VerifyKeys:
        return await self.store.registered_keys()

    async def partition_state(self, partition: int) -> PartitionState | None:
        return await self.store.partition_state(partition)

    async def partition_leases(self) -> list[PartitionLease]:
        """Who holds each partition and when it last renewed: the present, not the log's."""
        return await self.store.partition_leases()
