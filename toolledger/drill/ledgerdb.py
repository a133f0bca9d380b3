"""The drill's own view of the ledger's PostgreSQL schema, beside the store the product uses.

The driver asks questions no product API answers, because they are about processes rather than
calls: which projector's lock session holds which partition, whether a projector is inside a
batch transaction right now, which server sessions belong to a process. It also reads the run
and unsettled-call tables directly, as the independent side of the operator-listing check.

A drill may restart PostgreSQL under everyone's feet; every query here retries (bounded) until
it gets an answer, so the driver survives what it inflicts. The driver's loops ask at the same
time, so the queries go through a small pool, never one shared connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import asyncpg

from toolledger.projections.batch_sql import LOAD
from toolledger.projections.dberrors import DATABASE_ERRORS
from toolledger.projections.migrations import quote_ident
from toolledger.projections.ownership import lock_class


class LedgerDB:
    """A small connection pool on a ledger schema, for the drill's own questions."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._opening = asyncio.Lock()

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with contextlib.suppress(*DATABASE_ERRORS):
                await asyncio.wait_for(pool.close(), 10)
            pool.terminate()

    async def _get_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        async with self._opening:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=3,
                    timeout=10,
                    server_settings={
                        "search_path": quote_ident(self.schema),
                        "application_name": "toolledger-drill",
                    },
                )
            return self._pool

    async def fetch(self, query: str, *args: Any, patience: float = 120.0) -> list[asyncpg.Record]:
        """`query`'s rows; retried on a lost connection for up to `patience` seconds."""
        give_up = time.monotonic() + patience
        while True:
            try:
                pool = await self._get_pool()
                return list(await pool.fetch(query, *args, timeout=30))
            except DATABASE_ERRORS:
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.2)

    async def run_states(self, tenant: str) -> dict[str, tuple[str, int | None]]:
        """run_id -> (status, version) for the tenant's runs."""
        rows = await self.fetch(
            "SELECT run_id, status, version FROM runs WHERE tenant_id = $1", tenant
        )
        return {r["run_id"]: (r["status"], r["version"]) for r in rows}

    async def completed_calls(self, tenant: str) -> dict[str, int]:
        """run_id -> how many of its calls are completed."""
        rows = await self.fetch(
            "SELECT run_id, count(*) AS n FROM tool_executions WHERE tenant_id = $1 "
            "AND status = 'completed' GROUP BY run_id",
            tenant,
        )
        return {r["run_id"]: int(r["n"]) for r in rows}

    async def unsettled(self, tenant: str) -> dict[str, int]:
        """key -> version of the tenant's unsettled calls (`started`, `indeterminate`)."""
        rows = await self.fetch(
            "SELECT key, version FROM tool_executions WHERE tenant_id = $1 "
            "AND status IN ('started', 'indeterminate')",
            tenant,
        )
        return {r["key"]: r["version"] for r in rows}

    async def lock_owners(self) -> dict[int, int]:
        """partition -> OS pid of the projector whose lock session holds it."""
        rows = await self.fetch(
            "SELECT l.objid::int AS partition, a.application_name FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.classid::bigint = $1::bigint "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            lock_class(self.schema),
        )
        owners = {}
        for r in rows:
            name = r["application_name"] or ""
            if name.startswith("toolledger-locks-"):
                owners[int(r["partition"])] = int(name.removeprefix("toolledger-locks-"))
        return owners

    async def in_batch(self, pid: int) -> bool:
        """Whether projector `pid` is inside a batch right now.

        Inside means: its store session holds the offset row (a large batch's transaction, or
        a small batch's one statement while it runs), or that session's last statement is a
        small batch's load, so the projector is folding and has not sent the write yet (the
        session is held from the load to the write). Asked of a frozen projector, the answer
        stays true until it is thawed (except a small batch's statement, which finishes).
        """
        rows = await self.fetch(
            "SELECT 1 FROM pg_stat_activity a WHERE a.application_name = $1 AND ("
            "EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted "
            "AND l.relation = 'projection_offsets'::regclass AND l.mode = 'RowExclusiveLock') "
            "OR (a.state = 'idle' AND left(a.query, 200) = left($2, 200))) LIMIT 1",
            f"toolledger-store-{pid}",
            LOAD,
            patience=30,
        )
        return bool(rows)

    async def terminate(self, application_names: list[str]) -> int:
        """End every server session with one of these application names; how many ended."""
        rows = await self.fetch(
            "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity "
            "WHERE application_name = ANY($1::text[])",
            application_names,
        )
        return sum(1 for r in rows if r["ok"])
