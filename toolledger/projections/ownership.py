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
the lock session is bounded by PostgreSQL itself: `idle_session_timeout` (PostgreSQL 14 and
later) ends it once it has been idle for the lease, `TOOLLEDGER_OWNER_LEASE_S`, and
`tcp_user_timeout` once what it sends a dead peer stays unacknowledged that long. A live owner
renews: a task of its own sends one statement every quarter of the lease, which also records the
renewal in `projection_leases` for operators (`toolledger.projections.leases`). It runs on the
lock session alone, beside the batches, so a batch waiting on PostgreSQL or Kafka cannot delay
it; an event loop that does not turn at all is exactly a hung owner, and loses its lease as one.
PostgreSQL 13 has no `idle_session_timeout`: the first connection refuses it (`ConfigError`).

The owner stops trusting its lease before PostgreSQL can end it: `holds(partition)` is true only
while the session answered a statement sent within the last `TRUSTED_SHARE` of the lease. The
leader answers for a partition only while its process holds it, and the projector writes a batch
only once `confirmed` says so: after a stall it asks the session once and, finding it gone,
stands down before writing anything.

Locks and leases are an optimisation for liveness, not the safety fence: a zombie that still
believes it holds a partition is stopped by the offset compare-and-set in
`LedgerStore.apply_batch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from toolledger.errors import ConfigError
from toolledger.projections.dberrors import database_errors
from toolledger.projections.migrations import quote_ident

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("toolledger.projector")

#: Seconds of `TOOLLEDGER_OWNER_LEASE_S` unless configured.
DEFAULT_LEASE_S = 10.0
#: Renewals per lease: Kafka's consumers heartbeat three times per session timeout; a fourth
#: leaves an owner whose loop stalls for three quarters of the lease still the owner.
RENEWALS_PER_LEASE = 4
#: The share of the lease, counted from the last statement the lock session answered, during
#: which the owner trusts that it holds its locks (`holds`): it stops acting as the owner before
#: PostgreSQL may end the session.
TRUSTED_SHARE = 0.8
#: The first PostgreSQL major version with `idle_session_timeout`.
LEASE_SINCE_MAJOR = 14

_T = TypeVar("_T")

_RENEW = (
    "INSERT INTO projection_leases (partition, owner, lease_s, renewed_at) "
    "SELECT p, $1, $2, now() FROM unnest($3::int4[]) AS p ON CONFLICT (partition) DO UPDATE "
    "SET owner = excluded.owner, lease_s = excluded.lease_s, renewed_at = excluded.renewed_at"
)
_RELEASE = (
    "UPDATE projection_leases SET owner = NULL WHERE partition = ANY($1::int4[]) AND owner = $2"
)


def check_lease_support(server_major: int, server_version: str) -> None:
    """`ConfigError` unless PostgreSQL `server_major` can end an idle session by itself.

    Without `idle_session_timeout` a hung projector would keep its partitions for as long as
    its process lives, which is the failure the lease exists to end; there is no fallback that
    keeps the promise (docs/architecture.md, "The owner's lease").
    """
    if server_major < LEASE_SINCE_MAJOR:
        raise ConfigError(
            f"TOOLLEDGER_DATABASE_URL points at PostgreSQL {server_version}, which cannot "
            f"enforce a projector's lease (TOOLLEDGER_OWNER_LEASE_S needs idle_session_timeout, "
            f"PostgreSQL {LEASE_SINCE_MAJOR} and later): a hung projector would keep its "
            "partitions until its sessions were ended by hand. Upgrade PostgreSQL to "
            f"{LEASE_SINCE_MAJOR} or later"
        )


async def _bound(conn: asyncpg.Connection, milliseconds: str) -> None:
    """Have PostgreSQL end this session once idle for `milliseconds`, and once what it sends
    stays unacknowledged that long where the server's platform can tell (TCP_USER_TIMEOUT:
    Linux; elsewhere the idle bound alone ends a silent owner's session)."""
    import asyncpg

    await conn.execute("SELECT set_config('idle_session_timeout', $1, false)", milliseconds)
    try:
        await conn.execute("SELECT set_config('tcp_user_timeout', $1, false)", milliseconds)
    except asyncpg.InvalidParameterValueError:
        log.debug("this PostgreSQL server's platform has no TCP_USER_TIMEOUT")


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
    """Advisory locks `(lock_class(schema), partition)` on one dedicated session, held under a
    lease of `lease_s` seconds (see the module)."""

    def __init__(
        self, dsn: str, schema: str, *, share: bool = False, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        self._dsn = dsn
        self._schema = schema
        self._class = lock_class(schema)
        self._members = member_class(schema)
        self._share = share
        self.lease_s = lease_s
        #: Who renews, as `projection_leases.owner` shows it.
        self.owner = f"{socket.gethostname()} pid {os.getpid()}"
        self._conn: asyncpg.Connection | None = None
        self._held: set[int] = set()
        #: One statement at a time on the session (asyncpg runs no more), renewals included.
        self._using = asyncio.Lock()
        #: When (monotonic) the last statement the session answered was sent: PostgreSQL's
        #: bound restarted no earlier.
        self._answered = -math.inf
        #: The session was lost while holding partitions, and `check` has not said so yet.
        self._lost = False
        self._renewing: asyncio.Task[None] | None = None

    # -- the session --------------------------------------------------------------------------

    async def _connect(self) -> asyncpg.Connection:
        import asyncpg  # the driver loads only where PostgreSQL is used

        conn = await asyncpg.connect(
            self._dsn,
            server_settings={
                "application_name": f"toolledger-locks-{os.getpid()}",
                "search_path": quote_ident(self._schema),
                "synchronous_commit": "off",  # a renewal lost in a crash is no loss
            },
        )
        try:
            version = conn.get_server_version()
            check_lease_support(version.major, f"{version.major}.{version.minor}")
            await _bound(conn, str(max(1, round(self.lease_s * 1000))))
            if self._share:
                await conn.execute(
                    "SELECT pg_advisory_lock($1::int4, pg_backend_pid())", self._members
                )
        except BaseException:
            conn.terminate()
            raise
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew_every(), name="toolledger-lease")
        return conn

    async def _on_session(
        self, statement: Callable[[asyncpg.Connection], Awaitable[_T]], *, connect: bool = True
    ) -> _T:
        """Run `statement` on the lock session, one at a time; its answer renews the lease from
        when it was sent. A new session is opened only if `connect` (the old one's partitions
        are gone with it). A session that fails, or does not answer within the lease, is
        dropped with its partitions, and the error raised as a database error."""
        async with self._using:
            conn = self._conn
            if conn is None or conn.is_closed():
                self._forget()
                if not connect:
                    raise ConnectionError("the partition lock session is gone")
                conn = self._conn = await self._connect()
            sent = time.monotonic()
            try:
                async with asyncio.timeout(self.lease_s):
                    result = await statement(conn)
            except TimeoutError as exc:
                self._forget()
                raise ConnectionError(
                    f"the partition lock session did not answer within the lease "
                    f"({self.lease_s:g}s)"
                ) from exc
            except database_errors():
                self._forget()
                raise
            self._answered = sent
            return result

    def _forget(self) -> None:
        """The session is gone or going: so are its locks."""
        if self._held:
            self._lost = True
        self._held.clear()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def _renew_every(self) -> None:
        """Renew the lease every quarter of it, for as long as the locks are open: one
        statement, which restarts PostgreSQL's bound and records the renewal."""
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE)
            if self._conn is None:
                continue  # lost: the projector's next ownership round opens a session
            try:
                await self.renew()
            except database_errors() as exc:
                log.warning("the partition lock session is gone (%s): its locks are free", exc)
            except Exception:  # the lease must outlive a bug in one renewal
                log.exception("renewing the partition lease failed")

    async def renew(self) -> None:
        """Renew the lease now, on the session as it is (never a new one)."""

        def renewal(conn: asyncpg.Connection) -> Awaitable[str]:
            return conn.execute(_RENEW, self.owner, self.lease_s, sorted(self._held))

        await self._on_session(renewal, connect=False)

    # -- the locks ----------------------------------------------------------------------------

    async def acquire(self, partitions: Iterable[int]) -> set[int]:
        if self._share:
            return await self._acquire_share(sorted(set(partitions)))
        wanted = sorted(set(partitions) - self._held)
        if not wanted:
            return set()
        rows = await self._on_session(
            lambda conn: conn.fetch(
                "SELECT p, pg_try_advisory_lock($1::int4, p) AS ok FROM unnest($2::int4[]) AS p",
                self._class,
                wanted,
            )
        )
        taken = {int(r["p"]) for r in rows if r["ok"]}
        self._held |= taken
        await self._record(taken)
        return taken

    async def _value(self, query: str, *args: object) -> Any:
        return await self._on_session(lambda conn: conn.fetchval(query, *args))

    async def _acquire_share(self, partitions: list[int]) -> set[int]:
        """Take free partitions up to this process's share; release those above it."""
        members = max(1, int(await self._value(_MEMBERS, self._members)))
        share = -(-len(partitions) // members)
        if len(self._held) > share:
            released = sorted(self._held)[share:]
            for partition in released:
                await self._value(
                    "SELECT pg_advisory_unlock($1::int4, $2::int4)", self._class, partition
                )
                self._held.discard(partition)
            await self._on_session(lambda conn: conn.execute(_RELEASE, released, self.owner))
            return set()
        taken: set[int] = set()
        # Start at a different partition in each process, so joiners do not all race for one.
        start = os.getpid() % len(partitions) if partitions else 0
        for partition in partitions[start:] + partitions[:start]:
            if len(self._held) >= share:
                break
            if partition in self._held:
                continue
            if await self._value(
                "SELECT pg_try_advisory_lock($1::int4, $2::int4)", self._class, partition
            ):
                self._held.add(partition)
                taken.add(partition)
        await self._record(taken)
        return taken

    async def _record(self, taken: set[int]) -> None:
        """Show the partitions just taken as renewed by this process, before the next renewal."""
        if taken:
            held = sorted(taken)
            await self._on_session(
                lambda conn: conn.execute(_RENEW, self.owner, self.lease_s, held)
            )

    async def check(self) -> bool:
        if self._held and not self._lost:
            with contextlib.suppress(*database_errors()):
                await self._on_session(lambda conn: conn.fetchval("SELECT 1"))
        lost, self._lost = self._lost, False
        return not lost

    def held(self) -> set[int]:
        return set(self._held)

    def holds(self, partition: int) -> bool:
        """Held, and the session answered within the trusted share of the lease."""
        return (
            partition in self._held
            and time.monotonic() - self._answered < TRUSTED_SHARE * self.lease_s
        )

    async def confirmed(self, partition: int) -> bool:
        """At once while `holds`; after a longer silence, once the session answers again
        (False: it is gone, its partitions free for others)."""
        if self.holds(partition):
            return True
        if partition in self._held:
            with contextlib.suppress(*database_errors()):
                await self._on_session(lambda conn: conn.fetchval("SELECT 1"), connect=False)
        return self.holds(partition)

    async def close(self) -> None:
        """Release every lock (the lease rows keep when each partition was last renewed)."""
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        async with self._using:
            held = sorted(self._held)
            self._held.clear()
            self._lost = False
            conn, self._conn = self._conn, None
            if conn is None or conn.is_closed():
                return
            try:
                if held:
                    await conn.execute(_RELEASE, held, self.owner, timeout=2)
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
