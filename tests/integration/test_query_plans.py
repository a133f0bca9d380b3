"""The hot-path queries probe indexes on a ledger that has never been analysed.

A new schema (a new ledger, replay, a benchmark) has no planner statistics, and a server may
run without autovacuum (the shared one here does): nothing analyses it. A point read written as
a plain join with an unnested array was then hashed against the whole of `tool_executions` or
`verdicts` under asyncpg's cached generic plan, so every call cost more as the ledger grew: 64
concurrent runs fell from 1,295 to 737 calls/s over four rounds of 2,560 calls. Each query is
held here to index probes under the generic plan, on a schema filled and never analysed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from tests import builders as b
from toolledger.events.fold import Positioned
from toolledger.events.log import LogIdentity
from toolledger.projections.batch_sql import LOAD, VERDICTS_BY_ID
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.postgres_reads import _CALL, _CALLS

CALLS = 1500


@pytest.fixture
async def filled(pg_dsn: str, pg_schema: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A schema with CALLS completed calls in it, never analysed, and a connection to it."""
    store = PostgresLedger(pg_dsn, pg_schema)
    await store.start()
    await store.bind_log(LogIdentity("toolledger.events", uuid.uuid4(), 1))
    events = []
    for n in range(CALLS):
        reserved = b.reserved(f"r{n % 50}", f"c{n}")
        events += [reserved, b.completed(reserved)]
    offset = 1
    for at in range(0, len(events), 500):
        items = [Positioned(0, offset + i, e) for i, e in enumerate(events[at : at + 500])]
        await store.apply_batch(0, offset, offset + len(items), items)
        offset += len(items)
    await store.close()
    conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": pg_schema})
    try:
        analysed = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = $1 "
            "AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)",
            pg_schema,
        )
        assert analysed == 0, "the point of the test is a schema nobody analysed"
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn
    finally:
        await conn.close()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def _generic_plan(conn: asyncpg.Connection[Any], sql: str, types: str) -> list[str]:
    """The node types and relations of `sql`'s generic plan, as `Seq Scan on verdicts`."""
    await conn.execute(f"PREPARE probe ({types}) AS {sql}")
    try:
        nulls = ", ".join("NULL" for _ in types.split(","))
        text = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE probe ({nulls})")
    finally:
        await conn.execute("DEALLOCATE probe")
    plan = json.loads(text)[0]["Plan"]
    return [f"{n['Node Type']} on {n.get('Relation Name', '-')}" for n in _nodes(plan)]


@pytest.mark.parametrize(
    ("name", "sql", "types"),
    [
        ("the projector's batch load", LOAD, "text[], text[], uuid[], text[]"),
        ("the runtime's read of several calls", _CALLS, "text[]"),
        ("the runtime's read of one call", _CALL, "text"),
        ("verdicts by event_id (runtime and store)", VERDICTS_BY_ID, "uuid[]"),
    ],
)
async def test_a_hot_path_query_probes_indexes_without_statistics(
    filled: asyncpg.Connection[Any], name: str, sql: str, types: str
) -> None:
    nodes = await _generic_plan(filled, sql, types)
    whole_table = [
        n for n in nodes if n.startswith(("Seq Scan", "Hash", "Merge Join", "Bitmap Heap Scan"))
    ]
    assert not whole_table, f"{name} reads whole tables under its generic plan: {nodes}"
    assert any(n.startswith(("Index Scan", "Index Only Scan")) for n in nodes), nodes
