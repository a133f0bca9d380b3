"""StackPort: the runtime port over one `LedgerStack` (memory, or Kafka and PostgreSQL).

Reads of a call go through the stack's `CallReads` (`toolledger.projections.reads`): with many
runs in flight, the reads asked while one is under way share the next query. Appends and
verdicts go through the stack's `LedgerCommands`, looked up on every use rather than kept,
so a harness that wraps the stack's commands (a test's frozen append) wraps every direct path
of the runtime at once (the leader fast path does not take them: the drill wraps its port).

Reads go to PostgreSQL at once: those on the road of a call are hints the decider's verdict
corrects (the read of a key before its reservation, the run's tenant, the twin guard), and
this process reads its own writes without help (its verdicts are committed, and an outcome
returned on acknowledgement is awaited by `own_write`). `fresh` waits at the stack's read
barrier (`toolledger.projections.barrier`) for every other process's writes, before a read
that must see them (`Ledger.read_call` and the other reads a user makes).

A driver error of the store is turned into `LedgerUnavailable` in the runtime's words ("nothing
was run, try again once PostgreSQL is reachable"): the port's first promise, fail closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Collection

from toolledger.errors import LedgerUnavailable
from toolledger.events.models import Event
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.port import CallQuery, RuntimePort
from toolledger.projections.dberrors import database_errors
from toolledger.wiring.stack import LedgerStack

log = logging.getLogger("toolledger.runtime")


@contextlib.asynccontextmanager
async def _store_errors(what: str) -> AsyncIterator[None]:
    """Fail closed in the runtime's words: a driver error of the store is `LedgerUnavailable`."""
    try:
        yield
    except database_errors() as exc:
        raise LedgerUnavailable(
            f"cannot read {what} ({type(exc).__name__}: {exc}); nothing was run. Try again "
            "once PostgreSQL is reachable."
        ) from exc


class StackPort(RuntimePort):
    """`RuntimePort` over `stack`; it owns nothing (closing the stack is its owner's job)."""

    def __init__(self, stack: LedgerStack) -> None:
        self.stack = stack
        self._watched: dict[uuid.UUID, asyncio.Future[Verdict]] = {}

    @property
    def limits(self) -> PayloadLimits:
        return self.stack.commands.limits

    async def fresh(self, run_ids: Collection[str] | None = None) -> None:
        """Return once the reads that follow see every write acknowledged before this call in
        the partitions of `run_ids` (None: all), whichever process made it: the stack's read
        barrier. `LedgerUnavailable` (`StaleRead`) past its bound."""
        async with _store_errors("where the projection has committed"):
            await self.stack.reads.barrier.wait(run_ids)

    async def read_call(self, key: str) -> CallRecord | None:
        try:
            record = await self.stack.call_reads.get(key)
        except database_errors() as exc:
            raise LedgerUnavailable(
                f"cannot read the ledger record of {key} ({exc}); the call was not attempted. "
                "Call again once PostgreSQL is reachable."
            ) from exc
        return None if record is None else await self.stack.commands.restored_call(record)

    async def read_run(self, run_id: str) -> RunRecord | None:
        async with _store_errors(f"the ledger record of run {run_id}"):
            run = await self.stack.store.get_run(run_id)
        return None if run is None else await self.stack.commands.restored_run(run)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        async with _store_errors(f"the calls of run {query.run_id or '(any)'}"):
            return await self.stack.store.list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        async with _store_errors("the ledger's runs"):
            return await self.stack.store.list_runs(statuses, tenant_id=tenant_id)

    async def restored_call(self, record: CallRecord) -> CallRecord:
        return await self.stack.commands.restored_call(record)

    async def append(self, event: Event, timeout: float) -> None:
        await self.stack.commands.append(event, timeout)

    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        while True:
            try:
                await self.stack.commands.append(event, each)
                return
            except LedgerUnavailable as exc:
                log.warning("%s for %s not appended yet (%s); retrying", event.type, event.key, exc)
                await asyncio.sleep(pause)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        commands = self.stack.commands
        return await commands.restored_verdict(await commands.append_and_await(event, timeout))

    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        watched = self._watched.pop(event_id, None)
        verdict = await self.stack.waiter.wait(event_id, timeout, watched)
        return await self.stack.commands.restored_verdict(verdict)

    def watch_verdict(self, event_id: uuid.UUID) -> None:
        self._watched[event_id] = self.stack.waiter.expect(event_id)

    def unwatch_verdict(self, event_id: uuid.UUID) -> None:
        watched = self._watched.pop(event_id, None)
        if watched is not None:
            self.stack.waiter.discard(event_id, watched)
