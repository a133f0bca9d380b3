"""LedgerAccess: the few ways the runtime reads the ledger and waits for it.

`Ledger` and the replay rules (`toolledger.runtime.replay`) share these, and they encode two
rules of docs/architecture.md that must not drift apart:

- **Fail closed.** A record that cannot be read (PostgreSQL down) is `LedgerUnavailable`, raised
  before any tool runs, never treated as "no record, go ahead".
- **An outcome's verdict is awaited without giving up.** Once a tool has run, its outcome is in
  the log; the runtime may wait a long time for the projector, but it never reports a guess.
  Only closing the ledger ends the wait.

Every record handed back here has its payloads restored: a result or arguments stored by
reference (`toolledger.events.payloads`) read as if they had been inline.

Reads go through the stack's `CallReads` (`toolledger.projections.reads`): with many runs in
flight, the reads asked while one is under way share the next query.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from datetime import datetime
from typing import TypedDict

from toolledger.events.models import CallEvent
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.projections.dberrors import DATABASE_ERRORS
from toolledger.projections.store import CallQuery
from toolledger.runtime.errors import LedgerUnavailable
from toolledger.runtime.executor import CallIdentity
from toolledger.stack import LedgerStack

log = logging.getLogger("toolledger.runtime")


@contextlib.asynccontextmanager
async def _store_errors(what: str) -> AsyncIterator[None]:
    """Fail closed in the runtime's words: a driver error of the store is `LedgerUnavailable`."""
    try:
        yield
    except DATABASE_ERRORS as exc:
        raise LedgerUnavailable(
            f"cannot read {what} ({type(exc).__name__}: {exc}); nothing was run. Try again "
            "once PostgreSQL is reachable."
        ) from exc


class Envelope(TypedDict):
    """The envelope fields every call event of one call carries."""

    key: str
    run_id: str
    tool_call_id: str
    tenant_id: str
    occurred_at: datetime


class LedgerAccess:
    """Reading records and awaiting verdicts on one `LedgerStack`."""

    stack: LedgerStack
    verdict_timeout: float
    clock: Callable[[], datetime]

    @property
    def closing(self) -> bool:
        return False

    def envelope(self, who: CallIdentity, at: datetime) -> Envelope:
        return {
            "key": who.key,
            "run_id": who.run_id,
            "tool_call_id": who.tool_call_id,
            "tenant_id": who.tenant_id,
            "occurred_at": at,
        }

    async def read_call(self, key: str) -> CallRecord | None:
        """The key's record; `LedgerUnavailable` (nothing ran) if the store cannot be read."""
        try:
            record = await self.stack.call_reads.get(key)
        except DATABASE_ERRORS as exc:
            raise LedgerUnavailable(
                f"cannot read the ledger record of {key} ({exc}); the call was not attempted. "
                "Call again once PostgreSQL is reachable."
            ) from exc
        return None if record is None else await self.stack.commands.restored_call(record)

    async def read_run(self, run_id: str) -> RunRecord | None:
        """The run's record; `LedgerUnavailable` if the store cannot be read."""
        async with _store_errors(f"the ledger record of run {run_id}"):
            return await self.stack.store.get_run(run_id)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching `query`; `LedgerUnavailable` if the store cannot be read."""
        async with _store_errors(f"the calls of run {query.run_id or '(any)'}"):
            return await self.stack.store.list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        """Runs in `statuses`; `LedgerUnavailable` if the store cannot be read."""
        async with _store_errors("the ledger's runs"):
            return await self.stack.store.list_runs(statuses, tenant_id=tenant_id)

    async def append_until_landed(self, event: CallEvent) -> None:
        """Append `event`, resending the same event_id until Kafka acknowledges it."""
        while True:
            try:
                await self.stack.commands.append(event, self.verdict_timeout)
                return
            except LedgerUnavailable as exc:
                log.warning("%s for %s not appended yet (%s); retrying", event.type, event.key, exc)
                await asyncio.sleep(0.1)

    async def settle(self, event: CallEvent) -> Verdict:
        """Append a finding (a reconcile result) and await its verdict, within the timeout."""
        verdict = await self.stack.commands.append_and_await(event, self.verdict_timeout)
        return await self.stack.commands.restored_verdict(verdict)

    async def await_verdict(self, event: CallEvent) -> Verdict:
        """The verdict of an appended outcome, however long the projector takes."""
        return await self.await_verdict_of(event.event_id, event.key)

    async def await_verdict_of(self, event_id: uuid.UUID, key: str) -> Verdict:
        waited = 0.0
        while True:
            try:
                verdict = await self.stack.waiter.wait(event_id, self.verdict_timeout)
                return await self.stack.commands.restored_verdict(verdict)
            except LedgerUnavailable as exc:
                if self.closing:
                    raise LedgerUnavailable(
                        f"the ledger was closed while awaiting the verdict on the outcome of {key};"
                        " the outcome is in the log and will be applied: read the call again"
                    ) from exc
                waited += self.verdict_timeout
                log.warning(
                    "no verdict on the outcome of %s after %.0fs (%s); still waiting, the run "
                    "parks until it arrives",
                    key,
                    waited,
                    exc,
                )
