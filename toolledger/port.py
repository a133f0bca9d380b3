"""RuntimePort: everything the runtime asks of a ledger, and what it may expect back.

This module is a floor of its own, below both the runtime (which asks through the port) and
the projections and wiring (which answer it): it imports nothing of toolledger but the errors
and the events, so a store can take `CallQuery` and an adapter can implement `RuntimePort`
without loading the runtime, and the runtime can stand on the port without loading storage.

`Ledger`, `AgentRun`, the call protocol (`toolledger.runtime.protocol`), the compensator and the
reconciler talk to the ledger through this port and nothing else, so the rules below hold in
one place instead of at every call site:

- **Fail closed.** A record that cannot be read (PostgreSQL down) is `LedgerUnavailable`, never
  "no record, go ahead". Only `LedgerUnavailable` and the documented permanent errors of an
  append (`PayloadError`, `RecordTooLarge`: resending could only fail the same way) escape it.
- **Payloads read as if inline.** Every record and verdict handed back has its payloads
  restored (`toolledger.events.payloads`), except the records of `list_calls`, which only
  `restored_call` pays for (a listing is read for keys and digests, rarely for results).
- **An append is retried with the same event_id**, so resending never applies a request twice.
- **Reads on the road of a call are hints; `fresh` makes a read fresh.** A read of a key before
  its reservation, of a run's tenant or of a run's calls for the twin guard may be a batch
  behind another process's writes: the decider's verdict corrects it. A read that must see
  every write acknowledged before it, by any process (`Ledger.read_call` and the other reads a
  user makes), first awaits `fresh`, the read barrier (docs/architecture.md, "Reads see every
  acknowledged write").

Waiting is not decided here: every method is bounded by the `timeout` it is given, and the
policies (how long, whether to try again) are the call protocol's `CallWaits`.
`CallQuery` (what `list_calls` asks), `NothingReserved` and `Envelope` are the port's own
types, so they live here; `LedgerUnavailable` (what every method raises when the ledger cannot
answer) is defined with the other errors in `toolledger.errors`, and imported from there.
The adapters are chosen by the wiring (`toolledger.wiring`): `StackPort` over a memory or a
Kafka and PostgreSQL stack.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from toolledger.errors import LedgerUnavailable
from toolledger.events.models import CallReserved, Event
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, CallStatus, RunRecord, Verdict

__all__ = ["CallQuery", "Envelope", "NothingReserved", "RuntimePort", "runs_of_key"]


def runs_of_key(key: str, *, may_be_run: bool = False) -> list[str]:
    """The run_ids a call key may belong to: each part before a `:` (a run_id written by another
    process may hold `:`), and with `may_be_run` the whole string too (a history read takes a
    key or a run_id). What a read of a key covers (`RuntimePort.fresh`)."""
    found = [key[:at] for at, char in enumerate(key) if char == ":" and at > 0]
    if may_be_run or not found:
        found.append(key)
    return found


class NothingReserved(LedgerUnavailable):
    """`read_or_reserve` could not read the key, so it appended nothing: a failed read, not a
    failed reservation (there is nothing to abandon). `error` is the read's own error, which
    the call raises in the end, as a read that failed by itself would."""

    code = "nothing_reserved"

    def __init__(self, error: LedgerUnavailable) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class CallQuery:
    """One page of the operator queue: a tenant's calls, longest-waiting first.

    Calls are ordered by `(updated_at, key)`: the call whose record changed longest ago comes
    first, and the key breaks ties so the order is total. `after` is the `(updated_at, key)` of
    the last call of the previous page (keyset pagination: a page never skips or repeats a call
    that did not change in between). `tenant_id=None` lists every tenant (admin tools only; the
    operator API always passes the token's tenant). Empty `statuses` means any status;
    `contested=True` lists only contested calls (False: only the others; None: both).
    `started_deadline_before` keeps only the `started` calls whose deadline passed before it
    (the console's queue lists overdue calls, not ones still running in time).
    """

    tenant_id: str | None
    statuses: frozenset[CallStatus] = frozenset()
    tool: str | None = None
    run_id: str | None = None
    contested: bool | None = None
    after: tuple[datetime, str] | None = None
    limit: int = 50
    started_deadline_before: datetime | None = None

    def matches(self, call: CallRecord) -> bool:
        overdue = self.started_deadline_before
        return (
            (self.tenant_id is None or call.tenant_id == self.tenant_id)
            and (not self.statuses or call.status in self.statuses)
            and (overdue is None or call.status != "started" or call.deadline < overdue)
            and (self.tool is None or call.tool == self.tool)
            and (self.run_id is None or call.run_id == self.run_id)
            and (self.contested is None or call.contested == self.contested)
            and (self.after is None or (call.updated_at, call.key) > self.after)
        )


class Envelope(TypedDict):
    """The envelope fields every call event of one call carries."""

    key: str
    run_id: str
    tool_call_id: str
    tenant_id: str
    occurred_at: datetime


class RuntimePort(ABC):
    """Reads, appends and verdicts; `LedgerUnavailable` when the ledger cannot answer."""

    @property
    @abstractmethod
    def limits(self) -> PayloadLimits:
        """The payload limits appends are held to (arguments over `max_bytes` are refused)."""

    @abstractmethod
    async def fresh(self, run_ids: Collection[str] | None = None) -> None:
        """Return once the reads that follow see every write acknowledged before this call, by
        any process, in the partitions of `run_ids` (None: all); `LedgerUnavailable` (a stale
        read) if that cannot be shown within the ledger's bound."""

    @abstractmethod
    async def read_call(self, key: str) -> CallRecord | None:
        """The key's record, payloads restored; None if the ledger has no such call."""

    @abstractmethod
    async def read_run(self, run_id: str) -> RunRecord | None:
        """The run's record, its transcript restored; None if the ledger has no such run."""

    @abstractmethod
    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching `query`, payloads not restored (see `restored_call`)."""

    @abstractmethod
    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        """Runs in `statuses`, of `tenant_id` if given."""

    @abstractmethod
    async def restored_call(self, record: CallRecord) -> CallRecord:
        """`record` with its referenced arguments and result back in place."""

    @abstractmethod
    async def append(self, event: Event, timeout: float) -> None:
        """Append `event` durably: returns on Kafka's acknowledgement, resending the same
        event_id on errors; `LedgerUnavailable` when none came within `timeout` seconds."""

    @abstractmethod
    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        """Append `event` until Kafka acknowledges it: tries of `each` seconds, `pause` seconds
        apart, for as long as it takes (cancel the caller to stop). Permanent errors escape."""

    @abstractmethod
    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        """Append `event` and return its verdict, both within `timeout` seconds in all. The
        verdict is registered for before the append, so none can be missed."""

    async def read_or_reserve(self, reserved: CallReserved, timeout: float) -> CallRecord | Verdict:
        """The key's record if the ledger has one, and nothing appended; else `reserved`
        appended and its verdict, as `append_and_await` (within `timeout`) gives it.

        This is the read of a new call's key and its reservation in one request, for an
        adapter that can answer both in one round trip (a partition leader holds the key in
        memory). Here, the two in turn. `NothingReserved` if the key could not be read; any
        other `LedgerUnavailable` may have left `reserved` appended.
        """
        record = await self._read_before_reserving(reserved)
        if record is not None:
            return record
        return await self.append_and_await(reserved, timeout)

    async def read_or_append(self, reserved: CallReserved, timeout: float) -> CallRecord | None:
        """`read_or_reserve` for a pipelined call: the key's record if it has one, and nothing
        appended; else None once `reserved` was appended as `append` appends it (its verdict
        watched for, if it was, and awaited later). The same errors as `read_or_reserve`."""
        record = await self._read_before_reserving(reserved)
        if record is not None:
            return record
        await self.append(reserved, timeout)
        return None

    async def _read_before_reserving(self, reserved: CallReserved) -> CallRecord | None:
        """The key's record; `NothingReserved` if it cannot be read."""
        try:
            return await self.read_call(reserved.key)
        except LedgerUnavailable as exc:
            raise NothingReserved(exc) from exc

    @abstractmethod
    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        """The verdict of an event appended earlier, within `timeout` seconds."""

    @abstractmethod
    def watch_verdict(self, event_id: uuid.UUID) -> None:
        """Watch for the verdict of an event about to be appended, so that the first
        `await_verdict` of it, later, needs no read of its own if the verdict came meanwhile
        (a pipelined reservation's, awaited after its tool ran). `unwatch_verdict` stops it
        when nobody will wait."""

    @abstractmethod
    def unwatch_verdict(self, event_id: uuid.UUID) -> None:
        """Stop watching for that verdict (nothing if it was awaited already)."""
