"""Point reads on the runtime's hot path: a call's record by key, verdicts by event_id, and the
projection's committed positions (what the read barrier waits on).

Every `Ledger.call` starts by reading its key (the fast path), and every command waits for its
verdict. With many runs in flight these reads come together, and each one costs a round trip, a
statement and a pooled connection's checkout on both sides of the socket. Two things make them
cheap without making them any less fresh:

- `CallReads` coalesces (`toolledger.projections.rounds`): a read asked while none is under way
  queries its key at once; reads asked meanwhile wait for the next round, which reads all their
  keys in one query. A round starts after every read it answers was asked, so a read never
  returns an older state than a query of its own would have. (The verdict waiter does the same
  for verdicts.)
- `PointReads` is where such readers read: they send one query at a time and need no pool,
  so PostgreSQL serves them on a connection of their own
  (`toolledger.projections.postgres_reads`); `StoreReads` reads through any `LedgerStore`.
"""

from __future__ import annotations

import uuid
from abc import abstractmethod
from collections.abc import Collection, Sequence

from toolledger.events.records import CallRecord, Verdict
from toolledger.projections.rounds import Rounds
from toolledger.projections.store import LedgerStore
from toolledger.projections.verdicts import VerdictSource


class PointReads(VerdictSource):
    """Call records and verdicts by key, for readers that gather their reads into one query
    at a time (`CallReads`, `VerdictWaiter`)."""

    @abstractmethod
    async def calls(self, keys: Collection[str]) -> dict[str, CallRecord]:
        """The records of those `keys` that have one."""

    @abstractmethod
    async def committed(self, partitions: Collection[int]) -> dict[int, int]:
        """The next offset the projection committed for each of `partitions` that has a
        position (the read barrier's, `toolledger.projections.barrier`)."""

    async def halts(self, partitions: Collection[int]) -> dict[int, str]:
        """Why each halted one of `partitions` stopped, as its owner recorded it: a halted
        partition is committed no further until someone deploys, so a reader waiting for it
        is told at once. None known, by default."""
        return {}

    async def close(self) -> None:
        """Release what the reader holds (a connection); it may be used again after."""


class StoreReads(PointReads):
    """Point reads through a `LedgerStore` (the memory ledger, or any store)."""

    def __init__(self, store: LedgerStore) -> None:
        self._store = store

    async def calls(self, keys: Collection[str]) -> dict[str, CallRecord]:
        found = {key: await self._store.get_call(key) for key in keys}
        return {key: record for key, record in found.items() if record is not None}

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        return await self._store.verdicts(event_ids)

    async def committed(self, partitions: Collection[int]) -> dict[int, int]:
        states = {p: await self._store.partition_state(p) for p in partitions}
        return {p: state.next_offset for p, state in states.items() if state is not None}


class CallReads:
    """Concurrent reads of call records, coalesced into one query per round (`Rounds`)."""

    def __init__(self, reads: PointReads) -> None:
        self.reads = reads
        self._rounds: Rounds[str, dict[str, CallRecord]] = Rounds(
            reads.calls, "toolledger-call-reads"
        )

    async def get(self, key: str) -> CallRecord | None:
        """The key's record; the reader's error if it cannot be read."""
        return (await self._rounds.ask((key,))).get(key)
