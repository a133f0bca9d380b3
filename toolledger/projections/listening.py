"""One LISTEN connection that outlives its connection: the base of every notification a process
hears.

PostgreSQL delivers a notification to the sessions listening on its channel when the sending
transaction commits, and to nobody who was not listening then: a listener whose connection died
has missed whatever was sent meanwhile. So a listener reconnects with backoff and says it may
have missed something (`missed`), before and after it is back, and whoever relies on it must
treat a notification as a hint with a fallback (a poll, a bound). Two channels use it: verdicts
(`toolledger.projections.verdicts`) and appends (`toolledger.projections.hints`).

The connection also sends: `notify` issues `pg_notify` on it, so a process that listens needs
no second connection to hint others.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from typing import TYPE_CHECKING, Any

from toolledger.projections.dberrors import database_errors

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("toolledger.listen")


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task (None: there is none) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def channel_for(kind: str, schema: str) -> str:
    """The channel `toolledger_<kind>_<schema>`, within PostgreSQL's 63-byte name limit."""
    channel = f"toolledger_{kind}_{schema}"
    if len(channel) <= 63:
        return channel
    suffix = hashlib.sha256(schema.encode()).hexdigest()[:8]
    return f"{channel[:54]}_{suffix}"


class PostgresListener:
    """LISTEN on `channel` over one connection, reconnecting when it dies; subclasses say what
    a payload means (`heard`) and what to do about notifications that may be lost (`missed`).
    """

    def __init__(self, dsn: str, channel: str, application: str) -> None:
        self._dsn = dsn
        self._channel = channel
        self._application = application
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self.reconnects = 0

    def heard(self, payload: str) -> None:
        """A notification's payload arrived."""

    def missed(self) -> None:
        """The connection was lost (and again once it is back): notifications may be lost."""

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._watch(), name=self._application)

    @property
    def backend_pid(self) -> int | None:
        """The listener's server pid (drills kill it to prove waiters survive)."""
        return None if self._conn is None else self._conn.get_server_pid()

    async def notify(self, channel: str, payload: str) -> None:
        """`pg_notify(channel, payload)` on this connection; a database error if it is down."""
        import asyncpg  # the driver loads only where PostgreSQL is used

        conn = self._conn
        if conn is None or conn.is_closed():
            raise asyncpg.ConnectionDoesNotExistError(f"the {self._application} connection is down")
        await conn.execute("SELECT pg_notify($1, $2)", channel, payload)

    async def _connect(self) -> None:
        import asyncpg  # the driver loads only where PostgreSQL is used

        conn = await asyncpg.connect(
            self._dsn, server_settings={"application_name": f"{self._application}-{os.getpid()}"}
        )
        conn.add_termination_listener(lambda _c: self._lost.set())
        await conn.add_listener(self._channel, self._on_notify)
        self._conn = conn
        self._lost.clear()

    def _on_notify(
        self,
        _conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        _pid: int,
        _channel: str,
        payload: object,
    ) -> None:
        self.heard(str(payload))

    async def _watch(self) -> None:
        delay = 0.05
        while True:
            await self._lost.wait()
            log.warning("LISTEN connection (%s) lost; reconnecting", self._channel)
            self.missed()
            while True:
                try:
                    await self._connect()
                except database_errors() as exc:
                    log.warning("LISTEN reconnect failed (%s)", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                self.reconnects += 1
                delay = 0.05
                self.missed()
                break

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
