"""`PostgresReads`: the runtime's point reads (and the read barrier's look at the committed
positions) on a PostgreSQL connection of their own.

A pooled read pays asyncpg's checkout and release (a task, a timer, a reset hook) on top of the
query; on a small machine that is about as much again as a primary-key SELECT, and these reads
are the hot path: every call reads its key, every command reads its verdict. Both callers
(`CallReads`, `VerdictWaiter`) already gather their reads into one query at a time, so they
share one connection, opened on first use (a process that never reads never connects), and
take turns on it; under load each turn reads for many calls.

Every statement here is a set of primary-key probes whose best plan never depends on the
values asked, so the session plans each one once (`plan_cache_mode=force_generic_plan`).
PostgreSQL's default re-plans a statement with array parameters on every execution, and for
the leader's provenance read that planning cost more than the probes: 0.52 ms a read against
0.19 ms with the generic plan (a probe on this machine, 300 reads each).

A read that fails or is cancelled drops the connection, whose session state is then unknown,
and the next read opens a new one: a database restart costs the reads in flight, as with the
pool, and the callers fail closed (`LedgerUnavailable`) or retry (the waiter) as before.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Collection, Sequence
from typing import Any

import asyncpg

from toolledger.events.records import CallRecord, Verdict
from toolledger.projections.batch_sql import CALL_TYPES, VERDICTS_BY_ID
from toolledger.projections.migrations import check_schema_name, quote_ident
from toolledger.projections.reads import PointReads

_COLUMNS = ", ".join(quote_ident(c) for c in CALL_TYPES)
# Built from batch_sql's constant column names only, never from input (hence S608).
_CALL = f"SELECT {_COLUMNS} FROM tool_executions WHERE key = $1"  # noqa: S608
# One primary-key probe per wanted key or event_id (a LATERAL subquery with LIMIT 1), for the
# reason `batch_sql.LOAD` gives: a plain join with the unnested array was hashed against the
# whole table on an unanalysed schema, which made every read cost more as the ledger grew.
_CALLS = (
    f"SELECT c.* FROM unnest($1::text[]) AS wanted(key) CROSS JOIN LATERAL "  # noqa: S608
    f"(SELECT {_COLUMNS} FROM tool_executions AS t WHERE t.key = wanted.key LIMIT 1) AS c"
)
_VERDICTS = VERDICTS_BY_ID
_COMMITTED = "SELECT partition, next_offset FROM projection_offsets WHERE partition = ANY($1)"
_HALTS = (
    "SELECT partition, halted FROM projection_offsets "
    "WHERE partition = ANY($1) AND halted IS NOT NULL"
)


class PostgresReads(PointReads):
    """Reads of call records and verdicts in one schema, on one lazily opened connection."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._dsn = dsn
        self._schema = check_schema_name(schema)
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._lock = asyncio.Lock()  # one statement at a time on the connection
        self._closed = False

    async def calls(self, keys: Collection[str]) -> dict[str, CallRecord]:
        if len(keys) == 1:
            rows = await self._fetch(_CALL, next(iter(keys)))
        else:
            rows = await self._fetch(_CALLS, list(keys))
        return {row["key"]: CallRecord.model_validate(dict(row)) for row in rows}

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        rows = await self._fetch(_VERDICTS, list(event_ids))
        found = (Verdict.model_validate_json(row["verdict_json"]) for row in rows)
        return {v.event_id: v for v in found}

    async def committed(self, partitions: Collection[int]) -> dict[int, int]:
        rows = await self._fetch(_COMMITTED, list(partitions))
        return {int(row["partition"]): int(row["next_offset"]) for row in rows}

    async def halts(self, partitions: Collection[int]) -> dict[int, str]:
        rows = await self._fetch(_HALTS, list(partitions))
        return {int(row["partition"]): str(row["halted"]) for row in rows}

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async with self._lock:
            conn = self._conn
            if self._closed:
                raise ConnectionError("these reads are closed; no connection is opened again")
            if conn is None or conn.is_closed():
                conn = self._conn = await asyncpg.connect(
                    self._dsn,
                    server_settings={
                        "search_path": quote_ident(self._schema),
                        "application_name": f"toolledger-reads-{os.getpid()}",
                        "plan_cache_mode": "force_generic_plan",
                    },
                )
            try:
                return await conn.fetch(sql, *args)
            except BaseException:
                self._conn = None
                conn.terminate()
                raise

    async def close(self) -> None:
        """Close the connection; a read after this raises `ConnectionError` (a database error
        to every caller) instead of opening a connection nobody would close."""
        self._closed = True
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:  # a connection that cannot say goodbye is simply dropped
                conn.terminate()
