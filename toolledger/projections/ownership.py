"""Who projects which partition: PostgreSQL advisory locks instead of consumer-group rebalances.

Each projector process holds one dedicated connection and calls `pg_try_advisory_lock` for every
partition of the events topic. A partition's lock is held by at most one session; when a process
dies its session ends, the locks free, and another process takes the partitions on its next
ownership round (every few hundred ms). Rebalances would pause every partition of every member
on each membership change, and the local broker takes half the session timeout to join a group;
locks move only the partitions that lost their owner.

With `share=True` the partitions are split evenly instead: every process also holds a member
lock (its class is the schema's member class, its key the backend pid), counts the members in
`pg_locks` on each round, takes free partitions only up to its share (the partition count
divided by the members, rounded up) and releases the ones above it, so a process that joins gets
its share within two rounds and a dead one's partitions go to the survivors.

**The owner's lease.** A process can stop without dying (SIGSTOP, a paused VM, an event loop
blocked in a long call), and a session's advisory locks live as long as the session: its
partitions would get no projection and no verdicts until someone ended its sessions by hand. So
the locks live on a `LeaseSession` (`toolledger.projections.lease_session`), which PostgreSQL
ends once the process has not renewed it for `TOOLLEDGER_OWNER_LEASE_S`. The renewal, from a
task of its own every quarter of the lease, also records in `projection_leases` which process
owns each partition and when it last renewed, for operators (`toolledger.projections.leases`).
An event loop that does not turn at all is exactly a hung owner, and loses its lease as one.

The owner stops trusting its lease before PostgreSQL can end it: `holds(partition)` is true only
while the session is trusted (it answered within the last 80% of the lease). The leader answers
for a partition only while its process holds it, and the projector writes a batch only once
`confirmed` says so: after a stall it asks the session once and, finding it gone, stands down
before writing anything.

Locks and leases are an optimisation for liveness, not the safety fence: a zombie that still
believes it holds a partition is stopped by the offset compare-and-set in
`LedgerStore.apply_batch`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from toolledger.projections.dberrors import database_errors
from toolledger.projections.lease_session import LeaseSession, session_name

if TYPE_CHECKING:
    import asyncpg

#: Seconds of `TOOLLEDGER_OWNER_LEASE_S` unless configured.
DEFAULT_LEASE_S = 10.0

_TRY_LOCKS = "SELECT p, pg_try_advisory_lock($1::int4, p) AS ok FROM unnest($2::int4[]) AS p"
_TRY_LOCK = "SELECT pg_try_advisory_lock($1::int4, $2::int4)"
_UNLOCK = "SELECT pg_advisory_unlock($1::int4, $2::int4)"
_PING = "SELECT 1"
_RENEW = (
    "INSERT INTO projection_leases (partition, owner, lease_s, renewed_at) "
    "SELECT p, $1, $2, now() FROM unnest($3::int4[]) AS p ON CONFLICT (partition) DO UPDATE "
    "SET owner = excluded.owner, lease_s = excluded.lease_s, renewed_at = excluded.renewed_at"
)
_RELEASE = (
    "UPDATE projection_leases SET owner = NULL WHERE partition = ANY($1::int4[]) AND owner = $2"
)


class PartitionLocks(ABC):
    """Exclusive ownership of partitions across processes."""

    @abstractmethod
    async def acquire(self, partitions: Iterable[int]) -> set[int]:
        """Try to take each partition; return those taken now (already held ones excluded)."""

    @abstractmethod
    async def check(self) -> bool:
        """Whether the locks taken so far are still held (False: all were lost)."""

    @abstractmethod
    def held(self) -> set[int]: ...

    def holds(self, partition: int) -> bool:
        """Whether this process may act as `partition`'s owner now, without asking anyone."""
        return partition in self.held()

    async def confirmed(self, partition: int) -> bool:
        """Whether this process still owns `partition`, asking its lock's session if need be
        (the last check before a batch is written)."""
        return self.holds(partition)

    @abstractmethod
    async def close(self) -> None:
        """Release every lock."""


def lock_class(schema: str) -> int:
    """The advisory-lock class id of a ledger schema: ledgers in one database never collide."""
    return zlib.crc32(f"toolledger:{schema}".encode()) & 0x7FFFFFFF


def member_class(schema: str) -> int:
    """The advisory-lock class of the projectors sharing a schema's partitions."""
    return zlib.crc32(f"toolledger-members:{schema}".encode()) & 0x7FFFFFFF


_MEMBERS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND classid = $1::int8::oid AND objsubid = 2 AND database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)


class PostgresPartitionLocks(PartitionLocks):
    """Advisory locks `(lock_class(schema), partition)` on one `LeaseSession`, held under a
    lease of `lease_s` seconds (see the module)."""

    def __init__(
        self, dsn: str, schema: str, *, share: bool = False, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        self._class = lock_class(schema)
        self._members = member_class(schema)
        self._share = share
        #: Who renews, as `projection_leases.owner` shows it.
        self.owner = f"{socket.gethostname()} pid {os.getpid()}"
        self._held: set[int] = set()
        #: The session was lost while holding partitions, and `check` has not said so yet.
        self._lost = False
        statements = [_TRY_LOCKS, _PING, _RELEASE]
        if share:
            statements += [_MEMBERS, _TRY_LOCK, _UNLOCK]
        self._session = LeaseSession(
            dsn,
            schema,
            lease_s,
            statements,
            name=session_name("locks"),
            renewal=(_RENEW, lambda: (self.owner, lease_s, sorted(self._held))),
            gone=self._gone,
            opened=self._join if share else None,
        )

    @property
    def lease_s(self) -> float:
        return self._session.lease_s

    def _gone(self) -> None:
        """The session is gone or going: so are its locks."""
        if self._held:
            self._lost = True
        self._held.clear()

    async def _join(self, conn: asyncpg.Connection) -> None:
        """Count this process among those sharing the partitions, for as long as its session."""
        await conn.execute("SELECT pg_advisory_lock($1::int4, pg_backend_pid())", self._members)

    async def renew(self) -> None:
        """Renew the lease now (the renewal task does every quarter of it)."""
        await self._session.renew()

    async def acquire(self, partitions: Iterable[int]) -> set[int]:
        if self._share:
            return await self._acquire_share(sorted(set(partitions)))
        wanted = sorted(set(partitions) - self._held)
        if not wanted:
            return set()
        rows = await self._session.run(_TRY_LOCKS, self._class, wanted)
        taken = {int(r["p"]) for r in rows if r["ok"]}
        self._held |= taken
        await self._record(taken)
        return taken

    async def _acquire_share(self, partitions: list[int]) -> set[int]:
        """Take free partitions up to this process's share; release those above it."""
        members = max(1, int(await self._session.value(_MEMBERS, self._members)))
        share = -(-len(partitions) // members)
        if len(self._held) > share:
            released = sorted(self._held)[share:]
            for partition in released:
                await self._session.value(_UNLOCK, self._class, partition)
                self._held.discard(partition)
            await self._session.run(_RELEASE, released, self.owner)
            return set()
        taken: set[int] = set()
        # Start at a different partition in each process, so joiners do not all race for one.
        start = os.getpid() % len(partitions) if partitions else 0
        for partition in partitions[start:] + partitions[:start]:
            if len(self._held) >= share:
                break
            if partition in self._held:
                continue
            if await self._session.value(_TRY_LOCK, self._class, partition):
                self._held.add(partition)
                taken.add(partition)
        await self._record(taken)
        return taken

    async def _record(self, taken: set[int]) -> None:
        """Show the partitions just taken as renewed by this process, before the next renewal."""
        if taken:
            await self._session.run(_RENEW, self.owner, self.lease_s, sorted(taken))

    async def check(self) -> bool:
        if self._held and not self._lost:
            with contextlib.suppress(*database_errors()):
                await self._session.run(_PING)
        lost, self._lost = self._lost, False
        return not lost

    def held(self) -> set[int]:
        return set(self._held)

    def holds(self, partition: int) -> bool:
        """Held, and the session trusted (it answered within most of the lease)."""
        return partition in self._held and self._session.trusted()

    async def confirmed(self, partition: int) -> bool:
        """At once while `holds`; after a longer silence, once the session answers again
        (False: it is gone, its partitions free for others)."""
        if self.holds(partition):
            return True
        if partition in self._held:
            with contextlib.suppress(*database_errors()):
                await self._session.run(_PING, connect=False)
        return self.holds(partition)

    async def close(self) -> None:
        """Release every lock (the lease rows keep when each partition was last renewed)."""
        held = sorted(self._held)
        self._held.clear()
        self._lost = False
        await self._session.close((_RELEASE, (held, self.owner)) if held else None)


class MemoryPartitionLocks(PartitionLocks):
    """One process owns everything: the embedded ledger has a single projector."""

    def __init__(self) -> None:
        self._held: set[int] = set()

    async def acquire(self, partitions: Iterable[int]) -> set[int]:
        taken = set(partitions) - self._held
        self._held |= taken
        return taken

    async def check(self) -> bool:
        return True

    def held(self) -> set[int]:
        return set(self._held)

    async def close(self) -> None:
        self._held.clear()
