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

Locks are an optimisation for liveness, not the safety fence: a zombie that still believes it
holds a partition is stopped by the offset compare-and-set in `LedgerStore.apply_batch`.
"""

from __future__ import annotations

import os
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from toolledger.projections.dberrors import database_errors

if TYPE_CHECKING:
    import asyncpg


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
    """Advisory locks `(lock_class(schema), partition)` on one dedicated session."""

    def __init__(self, dsn: str, schema: str, *, share: bool = False) -> None:
        self._dsn = dsn
        self._class = lock_class(schema)
        self._members = member_class(schema)
        self._share = share
        self._conn: asyncpg.Connection | None = None
        self._held: set[int] = set()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._held.clear()
            import asyncpg  # the driver loads only where PostgreSQL is used

            conn = await asyncpg.connect(
                self._dsn, server_settings={"application_name": f"toolledger-locks-{os.getpid()}"}
            )
            if self._share:
                await conn.execute(
                    "SELECT pg_advisory_lock($1::int4, pg_backend_pid())", self._members
                )
            self._conn = conn
        return self._conn

    async def acquire(self, partitions: Iterable[int]) -> set[int]:
        if self._share:
            return await self._acquire_share(sorted(set(partitions)))
        wanted = sorted(set(partitions) - self._held)
        if not wanted:
            return set()
        conn = await self._connection()
        rows = await conn.fetch(
            "SELECT p, pg_try_advisory_lock($1::int4, p) AS ok FROM unnest($2::int4[]) AS p",
            self._class,
            wanted,
        )
        taken = {int(r["p"]) for r in rows if r["ok"]}
        self._held |= taken
        return taken

    async def _acquire_share(self, partitions: list[int]) -> set[int]:
        """Take free partitions up to this process's share; release those above it."""
        conn = await self._connection()
        members = max(1, int(await conn.fetchval(_MEMBERS, self._members)))
        share = -(-len(partitions) // members)
        if len(self._held) > share:
            for partition in sorted(self._held)[share:]:
                await conn.fetchval(
                    "SELECT pg_advisory_unlock($1::int4, $2::int4)", self._class, partition
                )
                self._held.discard(partition)
            return set()
        taken: set[int] = set()
        # Start at a different partition in each process, so joiners do not all race for one.
        start = os.getpid() % len(partitions) if partitions else 0
        for partition in partitions[start:] + partitions[:start]:
            if len(self._held) >= share:
                break
            if partition in self._held:
                continue
            if await conn.fetchval(
                "SELECT pg_try_advisory_lock($1::int4, $2::int4)", self._class, partition
            ):
                self._held.add(partition)
                taken.add(partition)
        return taken

    async def check(self) -> bool:
        if not self._held:
            return True
        try:
            conn = await self._connection()
            if not self._held:  # the connection was replaced: the old session's locks are gone
                return False
            await conn.fetchval("SELECT 1")
        except database_errors():
            self._held.clear()
            await self._drop()
            return False
        return True

    def held(self) -> set[int]:
        return set(self._held)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        self._held.clear()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except database_errors():
                conn.terminate()
            except TimeoutError:
                conn.terminate()


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
