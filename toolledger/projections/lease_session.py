"""LeaseSession: a PostgreSQL session that lives only while its owner renews it.

The partition locks (`toolledger.projections.ownership`) live on one session, and a session's
advisory locks live as long as it does. A process can stop without dying (SIGSTOP, a paused VM,
an event loop blocked in a long call) and keep that session forever. So PostgreSQL itself bounds
it: `idle_session_timeout` (PostgreSQL 14 and later) ends it once it has waited for its client
for the lease, and `tcp_user_timeout` once what it sends a dead peer stays unacknowledged that
long, where the server's platform can tell.

The bound only starts while the session waits for its next statement, so the session must
never be left waiting for the rest of one: asyncpg prepares a statement it has not sent before
in a round trip of its own, and a client that hangs between that round trip and the statement
leaves the session mid-protocol, where no timeout applies (seen: a process blocked right after
its first ownership check kept its locks until it woke). Every statement the session will run
is therefore prepared as it connects, before it holds anything, and each later statement leaves
in one write.

The owner renews every `lease_s / RENEWALS_PER_LEASE` from a task of its own, on this session
alone, so nothing else it waits for can delay a renewal; any statement the session answers
restarts the bound too. It stops trusting the session before PostgreSQL may end it: `trusted`
is true only while the session answered a statement sent within the last `TRUSTED_SHARE` of the
lease. A session that fails or does not answer within the lease is dropped, and the owner told
(`gone`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from toolledger.errors import ConfigError
from toolledger.projections.dberrors import database_errors
from toolledger.projections.migrations import quote_ident

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.prepared_stmt import PreparedStatement

log = logging.getLogger("toolledger.projector")

#: Renewals per lease: Kafka's consumers heartbeat three times per session timeout; a fourth
#: leaves an owner whose loop stalls for three quarters of the lease still the owner.
RENEWALS_PER_LEASE = 4
#: The share of the lease, counted from the last statement the session answered, during which
#: its owner trusts it (`LeaseSession.trusted`): it stops acting before PostgreSQL may end it.
TRUSTED_SHARE = 0.8
#: The first PostgreSQL major version with `idle_session_timeout`.
LEASE_SINCE_MAJOR = 14


def check_lease_support(server_major: int, server_version: str) -> None:
    """`ConfigError` unless PostgreSQL `server_major` can end an idle session by itself.

    Without `idle_session_timeout` a hung projector would keep its partitions for as long as
    its process lives, which is the failure the lease exists to end; there is no fallback that
    keeps the promise (docs/architecture.md, "PostgreSQL 13 is refused").
    """
    if server_major < LEASE_SINCE_MAJOR:
        raise ConfigError(
            f"TOOLLEDGER_DATABASE_URL points at PostgreSQL {server_version}, which cannot "
            f"enforce a projector's lease (TOOLLEDGER_OWNER_LEASE_S needs idle_session_timeout, "
            f"PostgreSQL {LEASE_SINCE_MAJOR} and later): a hung projector would keep its "
            "partitions until its sessions were ended by hand. Upgrade PostgreSQL to "
            f"{LEASE_SINCE_MAJOR} or later"
        )


class LeaseSession:
    """One session bounded by a lease of `lease_s` seconds, named `name` in `pg_stat_activity`,
    that runs only `statements`; `renewal` is the renewing statement and what gives its
    arguments at the time, `opened` runs on each new session, `gone` is told when one is lost."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        lease_s: float,
        statements: Sequence[str],
        *,
        name: str,
        renewal: tuple[str, Callable[[], Sequence[object]]],
        gone: Callable[[], None],
        opened: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    ) -> None:
        self.lease_s = lease_s
        self._dsn = dsn
        self._schema = schema
        self._name = name
        self._statements = tuple(dict.fromkeys([*statements, renewal[0]]))
        self._renewal = renewal
        self._gone = gone
        self._opened = opened
        self._conn: asyncpg.Connection | None = None
        self._prepared: dict[str, PreparedStatement[asyncpg.Record]] = {}
        #: One statement at a time (asyncpg runs no more), renewals included.
        self._using = asyncio.Lock()
        #: When (monotonic) the last statement the session answered was sent: PostgreSQL's
        #: bound restarted no earlier.
        self._answered = -math.inf
        self._renewing: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        return self._conn is not None

    def trusted(self) -> bool:
        """Whether the session answered a statement sent within the trusted share of the lease."""
        return time.monotonic() - self._answered < TRUSTED_SHARE * self.lease_s

    async def run(self, query: str, *args: object, connect: bool = True) -> list[asyncpg.Record]:
        """`query`'s rows, one statement at a time; the answer renews the lease from when it
        was sent. A new session is opened only if `connect` (the old one's locks went with it).
        A session that fails, or does not answer within the lease, is dropped (`gone`) and the
        error raised as a database error."""
        return await self._run(query, lambda: args, connect=connect)

    async def value(self, query: str, *args: object) -> Any:
        rows = await self.run(query, *args)
        return rows[0][0] if rows else None

    async def renew(self) -> None:
        """Renew the lease now, on the session as it is (never a new one)."""
        await self._run(*self._renewal, connect=False)

    async def _run(
        self, query: str, args: Callable[[], Sequence[object]], *, connect: bool
    ) -> list[asyncpg.Record]:
        async with self._using:
            if self._conn is None or self._conn.is_closed():
                self.drop()
                if not connect:
                    raise ConnectionError(f"the session {self._name} is gone")
                self._conn = await self._connect()
            sent = time.monotonic()
            try:
                async with asyncio.timeout(self.lease_s):
                    rows = await self._prepared[query].fetch(*args())
            except TimeoutError as exc:
                self.drop()
                raise ConnectionError(
                    f"the session {self._name} did not answer within the lease ({self.lease_s:g}s)"
                ) from exc
            except database_errors():
                self.drop()
                raise
            self._answered = sent
            return rows

    async def _connect(self) -> asyncpg.Connection:
        import asyncpg  # the driver loads only where PostgreSQL is used

        conn = await asyncpg.connect(
            self._dsn,
            server_settings={
                "application_name": self._name,
                "search_path": quote_ident(self._schema),
                "synchronous_commit": "off",  # a renewal lost in a crash is no loss
            },
        )
        try:
            version = conn.get_server_version()
            check_lease_support(version.major, f"{version.major}.{version.minor}")
            bound = str(max(1, round(self.lease_s * 1000)))
            await conn.execute("SELECT set_config('idle_session_timeout', $1, false)", bound)
            try:
                await conn.execute("SELECT set_config('tcp_user_timeout', $1, false)", bound)
            except asyncpg.InvalidParameterValueError:
                log.debug("this PostgreSQL server's platform has no TCP_USER_TIMEOUT")
            self._prepared = {q: await conn.prepare(q) for q in self._statements}
            if self._opened is not None:
                await self._opened(conn)
        except BaseException:
            conn.terminate()
            raise
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew_every(), name="toolledger-lease")
        return conn

    def drop(self) -> None:
        """Drop the session (it is gone or must go), and tell the owner."""
        conn, self._conn = self._conn, None
        self._prepared = {}
        if conn is not None and not conn.is_closed():
            conn.terminate()
        self._gone()

    async def _renew_every(self) -> None:
        """Renew every `lease_s / RENEWALS_PER_LEASE` seconds, for as long as it is open."""
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE)
            if self._conn is None:
                continue  # lost: the owner's next use opens a session
            try:
                await self.renew()
            except database_errors() as exc:
                log.warning("the session %s is gone (%s): its locks are free", self._name, exc)
            except Exception:  # the lease must outlive a bug in one renewal
                log.exception("renewing the lease of %s failed", self._name)

    async def close(self, farewell: tuple[str, Sequence[object]] | None = None) -> None:
        """Stop renewing and close the session, running `farewell` on it first if it is open."""
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        async with self._using:
            conn, self._conn = self._conn, None
            prepared, self._prepared = self._prepared, {}
            if conn is None or conn.is_closed():
                return
            try:
                if farewell is not None:
                    await prepared[farewell[0]].fetch(*farewell[1], timeout=2)
                await conn.close(timeout=2)
            except database_errors():
                conn.terminate()
            except TimeoutError:
                conn.terminate()


def session_name(role: str) -> str:
    """`toolledger-<role>-<pid>`: how the drill and the tests tell whose session it is."""
    return f"toolledger-{role}-{os.getpid()}"
