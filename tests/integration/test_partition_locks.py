"""The partition locks' lease on PostgreSQL, in one process (issue 45).

An owner renews its lease from a task of its own, so the lock session survives however long
the projector has nothing to do and asks nothing of it; an owner that stopped cleanly clears
its name from the lease rows, so operators are not told a live owner holds what it gave up; and
a process that hangs with a statement in flight loses its locks at the lease all the same. What
happens to a projector whose renewals stop is shown on real processes in `test_owner_lease.py`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg

from tests.integration.procs import Procs, until
from toolledger.projections.ownership import PostgresPartitionLocks, lock_class
from toolledger.projections.postgres import PostgresLedger

LEASE_S = 1.0


async def _backend(dsn: str, schema: str) -> int | None:
    """The server pid of the session holding partition 0's lock."""
    conn = await asyncpg.connect(dsn)
    try:
        pid = await conn.fetchval(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = 0 "
            "AND objsubid = 2 AND classid::bigint = $1::bigint",
            lock_class(schema),
        )
    finally:
        await conn.close()
    return None if pid is None else int(pid)


async def test_an_owner_with_nothing_to_do_keeps_its_lease_by_renewing_alone(
    pg_dsn: str, pg_schema: str
) -> None:
    """An owner that asks nothing of its lock session for three leases (no batch, no ownership
    round) must keep it: its renewals alone restart PostgreSQL's bound, so another process
    never gets the partitions, and the lease rows never look stale. Without the renewals the
    session ends at the first lease and the other process takes both partitions."""
    store = PostgresLedger(pg_dsn, pg_schema)
    await store.start()
    owner = PostgresPartitionLocks(pg_dsn, pg_schema, lease_s=LEASE_S)
    other = PostgresPartitionLocks(pg_dsn, pg_schema, lease_s=LEASE_S)
    try:
        assert await owner.acquire(range(2)) == {0, 1}
        session = await _backend(pg_dsn, pg_schema)
        assert session is not None
        for _ in range(30):  # three leases
            await asyncio.sleep(LEASE_S / 10)
            leases = await store.partition_leases()
            assert [lease.partition for lease in leases] == [0, 1]
            assert not any(lease.stale for lease in leases), leases
            assert all(lease.owner == owner.owner for lease in leases), leases
        assert await other.acquire(range(2)) == set()
        assert await _backend(pg_dsn, pg_schema) == session
        assert owner.holds(0) and owner.holds(1) and await owner.check()
    finally:
        await owner.close()
        await other.close()
        await store.close()


async def test_an_owner_that_stops_cleanly_clears_its_name_and_frees_its_partitions(
    pg_dsn: str, pg_schema: str
) -> None:
    """Closing the locks releases the partitions at once and leaves the lease rows ownerless,
    with the time of the last renewal; the next owner's name replaces it when it takes them."""
    store = PostgresLedger(pg_dsn, pg_schema)
    await store.start()
    first = PostgresPartitionLocks(pg_dsn, pg_schema, lease_s=LEASE_S)
    second = PostgresPartitionLocks(pg_dsn, pg_schema, lease_s=LEASE_S)
    second.owner = "another host pid 1"
    try:
        assert await first.acquire(range(2)) == {0, 1}
        await first.close()
        assert [lease.owner for lease in await store.partition_leases()] == [None, None]
        assert await second.acquire(range(2)) == {0, 1}
        assert [lease.owner for lease in await store.partition_leases()] == [second.owner] * 2
    finally:
        await first.close()
        await second.close()
        await store.close()


async def test_an_owner_hung_with_a_statement_in_flight_still_loses_its_locks_at_the_lease(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    """A process that hangs right after sending a statement it had never sent before left its
    lock session waiting, mid-protocol, for the rest of that statement: PostgreSQL's idle bound
    never started, and the locks were held for as long as the process lived. Every statement
    of the lock session is prepared when it connects, so what is in flight is always complete,
    and the session ends at the lease; woken, the process finds its locks lost."""
    store = PostgresLedger(pg_dsn, pg_schema)
    await store.start()
    procs = Procs(tmp_path)
    other = PostgresPartitionLocks(pg_dsn, pg_schema, lease_s=LEASE_S)
    hung = procs.python(
        "hung", "tests.integration.lock_worker", pg_dsn, pg_schema, "2", "8", env={}
    )
    try:
        await hung.wait_for("blocking", timeout=30)
        blocked = time.monotonic()

        async def taken() -> bool:
            return await other.acquire(range(2)) == {0, 1} or bool(other.held())

        await until(taken, timeout=6, what="the hung process's partitions to be free")
        took = time.monotonic() - blocked
        assert "unblocked" not in hung.output(), "taken only once the process woke"
        assert took < 2 + 1.5, took
        await hung.wait_for("check False", timeout=30)
        assert await hung.wait_exit(timeout=30) == 0, hung.output()
    finally:
        procs.close()
        await other.close()
        await store.close()
