"""The PostgreSQL ledger store: the projection production runs on.

`apply_batch` is the projector's hot path. A small batch (a live projector's usual fetch; see
`toolledger.projections.batch_sql`) takes one round trip: one statement writes rows, history,
verdicts, dead letters, the offset compare-and-set and the notifications, writing nothing
unless the CAS hits. What the fold reads comes from what this store last wrote to the partition
(`KnownRows`: the owner of a partition is the only writer of its rows, and the CAS proves nobody
else committed to it since); whatever it does not know it assumes absent, and the statement
checks each assumption with an index probe and writes nothing if one fails, and the batch is
then folded again after a query that loads what it reads (as the first batch after taking a
partition is). A large batch (catch-up) is one transaction, in this order:

1. The offset compare-and-set (`UPDATE projection_offsets ... WHERE next_offset = $start`) runs
   first and holds the partition's row lock to the end, so a zombie projector whose CAS misses
   has written nothing, and a second projector racing for the partition waits, then misses.
2. One query loads the stored calls, runs and already-decided event_ids the batch names.
3. `BatchFold` (the `LedgerFold` that the memory store and replay use, so the decider's rules
   exist once) folds the batch in Python, while `_Appender` COPYs the history and verdict rows
   decided so far: PostgreSQL works while Python folds.
4. The changed calls go through a temporary table and one upsert, runs and dead letters through
   `executemany`, and one statement sends `pg_notify(notify_channel, event_id)` for each new
   verdict, in log order: a hint delivered on commit, on which waiters read their verdicts.
   Only a small batch's notifications carry the verdicts themselves (`batch_sql`): a large one
   is a catch-up, whose waiters are few, and copying thousands of verdicts into PostgreSQL's
   notification queue would cost every catch-up batch a few microseconds per event.

Statements are prepared once per connection (asyncpg's statement cache), and the pool does not
reset sessions between uses (`_keep_session` says why that is safe). Every connection's
`search_path` is the ledger's schema, so the SQL here and in the migrations stays unqualified.
JSON is stored as text so that what is read back is byte-for-byte what was folded, which keeps
`digest()` equal to `LedgerFold.digest()` over the same log."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import asyncpg

from toolledger.events.fold import DeadLetter, Folded, HistoryEntry, Positioned
from toolledger.events.log import LogIdentity
from toolledger.events.records import UNSETTLED, CallRecord, RunRecord, Verdict
from toolledger.events.signing import VerifyKeys
from toolledger.port import CallQuery
from toolledger.projections import keyring
from toolledger.projections.batch_sql import (
    CALL_TYPES,
    HISTORY_TYPES,
    LOAD,
    RUN_TYPES,
    VERDICT_TYPES,
    VERDICTS_BY_ID,
    SmallBatch,
    loaded,
)
from toolledger.projections.facts import Fact
from toolledger.projections.gc_pause import gc_paused
from toolledger.projections.known_rows import KnownRows, Reads, absent
from toolledger.projections.leases import PartitionLease, read_leases
from toolledger.projections.listening import channel_for
from toolledger.projections.migrations import check_schema_name, migrate, quote_ident
from toolledger.projections.store import (
    AppliedBatch,
    BatchFold,
    BatchOutcome,
    CallStats,
    LedgerSnapshot,
    LedgerStore,
    OffsetConflict,
    PartitionState,
    StatusCounts,
    StoreError,
    batch_reads,
    chained,
    check_batch,
    check_identity,
    history_keys,
)

if TYPE_CHECKING:
    from toolledger.projections.migrations import Conn

# The column lists live with the batch statements built from them (and check the models).
_CALL_TYPES = CALL_TYPES
_HISTORY_TYPES = HISTORY_TYPES
_RUN_COLUMNS = tuple(RUN_TYPES)


# These builders put identifiers and types into SQL; they only ever receive this module's
# constant table and column names, never input (hence the S608 exceptions).
def _select(table: str, columns: Iterable[str], rest: str = "") -> str:
    return f"SELECT {_names(columns)} FROM {table} {rest}"  # noqa: S608


def _insert(table: str, columns: Iterable[str], source: str) -> str:
    return f"INSERT INTO {table} ({_names(columns)}) {source}"


def _upsert(table: str, columns: Sequence[str], source: str) -> str:
    """INSERT ... ON CONFLICT on the first column, which overwrites every other column."""
    updates = ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in columns[1:])
    conflict = f" ON CONFLICT ({quote_ident(columns[0])}) DO UPDATE SET {updates}"
    return _insert(table, columns, source) + conflict


def _names(columns: Iterable[str]) -> str:
    return ", ".join(quote_ident(c) for c in columns)


_CAS = "UPDATE projection_offsets SET next_offset = $3 WHERE partition = $1 AND next_offset = $2"
_OFFSET = "SELECT next_offset FROM projection_offsets WHERE partition = $1"
_LIST_RUNS = _select(
    "runs",
    _RUN_COLUMNS,
    "WHERE status = ANY($1::text[]) AND ($2::text IS NULL OR tenant_id = $2) "
    "AND (NOT $4::boolean OR resume_error IS NOT NULL) "
    "ORDER BY updated_at NULLS FIRST, run_id LIMIT $3",
)
_VERDICTS = VERDICTS_BY_ID
# Changed calls are copied into a per-connection temporary table, then upserted in one statement:
# COPY has no ON CONFLICT, and binary COPY encodes rows far faster than unnest() arrays.
_BATCH_CALLS = "batch_tool_executions"
_CREATE_BATCH_CALLS = (
    f"CREATE TEMPORARY TABLE {_BATCH_CALLS} ("
    + ", ".join(f"{quote_ident(c)} {t}" for c, t in _CALL_TYPES.items())
    + ") ON COMMIT DELETE ROWS"
)
_UPSERT_CALLS = _upsert("tool_executions", tuple(_CALL_TYPES), _select(_BATCH_CALLS, _CALL_TYPES))
_UPSERT_RUN = _upsert(
    "runs",
    _RUN_COLUMNS,
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(_RUN_COLUMNS) + 1))})",
)
_VERDICT_COLUMNS = tuple(VERDICT_TYPES)
# In log order: a waiter may see hints in the order the events were appended.
_NOTIFY = (
    "SELECT pg_notify($1, event_id::text) FROM verdicts "
    'WHERE partition = $2 AND "offset" >= $3 AND "offset" < $4 ORDER BY "offset"'
)
_INSERT_DEAD_LETTER = (
    'INSERT INTO dead_letters (partition, "offset", run_id, reason, payload) '
    "VALUES ($1, $2, $3, $4, $5)"
)
_BIND = (
    "INSERT INTO projection_offsets (partition, next_offset, epoch, partitions) "
    "SELECT p, 1, $1, $2 FROM generate_series(0, $2 - 1) AS p "
    "WHERE NOT EXISTS (SELECT 1 FROM projection_offsets)"
)
_STATES = "SELECT partition, next_offset, epoch, partitions FROM projection_offsets"
_GET_CALL = _select("tool_executions", _CALL_TYPES, "WHERE key = $1")
_GET_RUN = _select("runs", _RUN_COLUMNS, "WHERE run_id = $1")
_HISTORY = _select(
    "tool_execution_history", _HISTORY_TYPES, 'WHERE key = $1 ORDER BY partition, "offset"'
)
_ALL_CALLS = _select("tool_executions", _CALL_TYPES)
_ALL_RUNS = _select("runs", _RUN_COLUMNS)
_ALL_HISTORY = _select("tool_execution_history", _HISTORY_TYPES, 'ORDER BY partition, "offset"')
_FACTS = (
    'SELECT partition, "offset", verdict_json, event_json FROM tool_execution_history '
    'JOIN verdicts USING (event_id, partition, "offset") '
    'WHERE partition = $1 AND "offset" >= $2 ORDER BY "offset" LIMIT $3'
)
_FACTS_PUBLISHED = "SELECT published_offset FROM facts_offsets WHERE partition = $1"
_PUT_BLOBS = (
    "INSERT INTO payload_blobs (digest, size, data) "
    "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[]) ON CONFLICT (digest) DO NOTHING"
)
_GET_BLOBS = "SELECT digest, data FROM payload_blobs WHERE digest = ANY($1::text[])"
_MARK_FACTS_PUBLISHED = (
    "INSERT INTO facts_offsets (partition, published_offset) VALUES ($1, $2) "
    "ON CONFLICT (partition) DO UPDATE SET published_offset = "
    "greatest(facts_offsets.published_offset, EXCLUDED.published_offset)"
)

_COUNT_BY_STATUS = "SELECT status, count(*) AS n FROM tool_executions GROUP BY status"
_HALTED = "UPDATE projection_offsets SET halted = $3 WHERE partition = $1 AND next_offset = $2"
_HALT_CLEARED = (
    "UPDATE projection_offsets SET halted = NULL WHERE partition = $1 AND halted IS NOT NULL"
)
_COUNT_RESUME_FAILED = "SELECT count(*) FROM runs WHERE resume_error IS NOT NULL"
_COUNT_TENANT = (
    "SELECT status, count(*) AS n, count(*) FILTER (WHERE deadline < $2) AS overdue "
    "FROM tool_executions WHERE $1::text IS NULL OR tenant_id = $1 GROUP BY status"
)
# Cumulative: a call unsettled for an hour counts under every bound up to an hour.
_COUNT_UNSETTLED = (
    "SELECT t.status, b.bound, count(*) AS n FROM tool_executions AS t "
    "JOIN unnest($2::float8[]) AS b(bound) "
    "ON t.updated_at <= $1::timestamptz - make_interval(secs => b.bound) "
    "WHERE t.status = ANY($3::text[]) GROUP BY t.status, b.bound"
)


def _list_calls_sql(query: CallQuery) -> tuple[str, list[Any]]:
    """The operator-queue query for `query`: only the predicates it uses, so each shape gets a
    plan that can use `tool_executions_listing` (migration 0002) instead of OR-ing NULL checks."""
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    where: list[str] = []
    if query.tenant_id is not None:
        where.append(f"tenant_id = {arg(query.tenant_id)}")
    if query.statuses:
        where.append(f"status = ANY({arg(sorted(query.statuses))}::text[])")
    if query.tool is not None:
        where.append(f"tool = {arg(query.tool)}")
    if query.run_id is not None:
        where.append(f"run_id = {arg(query.run_id)}")
    if query.started_deadline_before is not None:
        before = arg(query.started_deadline_before)
        where.append(f"(status <> 'started' OR deadline < {before}::timestamptz)")
    if query.contested is not None:
        where.append(f"contested = {arg(query.contested)}")
    if query.after is not None:
        at, key = query.after
        where.append(f"(updated_at, key) > ({arg(at)}::timestamptz, {arg(key)}::text)")
    rest = f"WHERE {' AND '.join(where)} " if where else ""
    rest += f"ORDER BY updated_at, key LIMIT {arg(query.limit)}"
    return _select("tool_executions", _CALL_TYPES, rest), args


_call_values = attrgetter(*_CALL_TYPES)
_history_values = attrgetter(*_HISTORY_TYPES)
_run_values = attrgetter(*_RUN_COLUMNS)


def _dead_values(d: DeadLetter) -> tuple[int, int, str | None, str, bytes]:
    return (d.partition, d.offset, d.run_id, d.reason, d.payload)


def _verdict_values(v: Verdict, h: HistoryEntry, text: str) -> tuple[Any, ...]:
    return (v.event_id, h.partition, h.offset, v.accepted, v.reason, text)


log = logging.getLogger("toolledger.store")
#: Seconds `PostgresLedger.close` waits for the pool's connections before terminating them.
CLOSE_TIMEOUT = 10.0
#: The largest batch written by one statement without an explicit transaction (`batch_sql`);
#: larger ones (catch-up) take the transaction where COPY overlaps the fold.
SMALL_BATCH = 64
_SMALL = SmallBatch()
_SMALL_RELAXED = SmallBatch(durable=False)
#: Events folded between two chances for the appender to move its COPY forward.
_SLICE = 32
#: The fewest new verdicts worth a COPY before the end of the batch.
_MIN_APPEND = 256


class _Appender:
    """Appends history and verdict rows with COPY while the rest of the batch is folded.

    The fold is Python CPU, the COPY is PostgreSQL CPU: on a small machine overlapping them is
    most of the difference between a projector that keeps up and one that does not. The
    appender owns the connection while a COPY is in flight; `offer` starts one when the previous
    finished and enough verdicts wait, then yields so it can progress. Leaving the context
    waits for the COPY in flight, so the transaction never ends under it, even on an error.
    """

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._written = 0
        #: The JSON of every verdict copied so far, in order (the facts reuse it).
        self.verdict_json: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Appender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task

    async def offer(self, history: list[HistoryEntry], verdicts: list[Verdict]) -> None:
        if self._task is not None:
            if not self._task.done():
                await asyncio.sleep(0)
                return
            task, self._task = self._task, None
            await task
        if len(verdicts) - self._written >= _MIN_APPEND:
            start, self._written = self._written, len(verdicts)
            rows = (history[start:], verdicts[start:])
            self._task = asyncio.create_task(self._copy(*rows))
        await asyncio.sleep(0)

    async def flush(
        self,
        history: list[HistoryEntry],
        verdicts: list[Verdict],
        texts: list[str] | None = None,
    ) -> None:
        """Append what is left (`texts`: the verdicts' JSON, if made); call after leaving the
        context."""
        if self._written < len(verdicts):
            left = None if texts is None else texts[self._written :]
            await self._copy(history[self._written :], verdicts[self._written :], left)
            self._written = len(verdicts)

    async def _copy(
        self, history: list[HistoryEntry], verdicts: list[Verdict], texts: list[str] | None = None
    ) -> None:
        if texts is None:
            texts = [v.model_dump_json() for v in verdicts]
        self.verdict_json += texts
        await self._conn.copy_records_to_table(
            "tool_execution_history",
            records=map(_history_values, history),
            columns=_HISTORY_TYPES,
        )
        await self._conn.copy_records_to_table(
            "verdicts",
            records=map(_verdict_values, verdicts, history, texts),
            columns=_VERDICT_COLUMNS,
        )


def notify_channel_for(schema: str) -> str:
    """The LISTEN channel of a schema's verdicts; within PostgreSQL's 63-byte name limit."""
    return channel_for("v", schema)


async def _init_connection(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    await conn.execute(_CREATE_BATCH_CALLS)


async def _keep_session(_conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """The pool's reset between two uses of a connection: nothing to undo.

    asyncpg's default sends `pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL` on
    every release, one more round trip on every batch and every verdict read. This pool never
    leaves session state behind: no session advisory locks (the partition locks have their
    own connection), no LISTEN (the listener has its own), no cursors, no SET (only
    `set_config(..., true)`, which ends with its transaction). asyncpg still rolls back a
    transaction left open before calling this.
    """


async def _load_heads(conn: Conn, keys: Collection[str]) -> dict[str, str]:
    """The chain heads of `keys` that have history, in one query (`LOAD`'s fourth part)."""
    if not keys:
        return {}
    return loaded(await conn.fetch(LOAD, [], [], [], list(keys)))[3]


async def _load(
    conn: Conn, items: Sequence[Positioned | DeadLetter]
) -> tuple[dict[str, CallRecord], dict[str, RunRecord], set[uuid.UUID], dict[str, str]]:
    """The stored calls, runs, decided event_ids and chain heads that folding `items` reads, in
    one query."""
    keys, run_ids, event_ids = batch_reads(items)
    calls, runs, decided, heads = loaded(
        await conn.fetch(LOAD, list(keys), list(run_ids), list(event_ids), list(keys | run_ids))
    )
    return (
        {c["key"]: CallRecord.model_validate(c) for c in calls},
        {r["run_id"]: RunRecord.model_validate(r) for r in runs},
        {uuid.UUID(bytes=event_id.bytes) for event_id in decided},
        heads,
    )


def _state(row: asyncpg.Record) -> PartitionState:
    return PartitionState(
        partition=row["partition"],
        next_offset=row["next_offset"],
        epoch=uuid.UUID(bytes=row["epoch"].bytes),
        partitions=row["partitions"],
    )


#: The most call, run, head and event_id entries `_Known` keeps per partition; past it, the
#: next batch loads what it reads again and starts over. A call record can hold an inline result
#: of up to `TOOLLEDGER_PAYLOAD_INLINE_BYTES`, so this bounds memory, at the price of one load
#: per few thousand calls of a partition.
KNOWN_LIMIT = 10_000


class PostgresLedger(LedgerStore):
    """The ledger in one PostgreSQL schema, behind a connection pool."""

    def __init__(
        self,
        dsn: str,
        schema: str = "toolledger",
        *,
        verify_keys: VerifyKeys | None = None,
        pool_size: int = 4,
        synchronous_apply: bool = False,
        create: bool = True,
    ) -> None:
        self._dsn = dsn
        self._create = create
        self._synchronous_apply = synchronous_apply
        self._small = _SMALL if synchronous_apply else _SMALL_RELAXED
        self._known: dict[int, KnownRows] = {}
        self._schema = check_schema_name(schema)
        self.verify_keys = verify_keys or VerifyKeys()
        self._pool_size = pool_size
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None

    @property
    def schema(self) -> str:
        return self._schema

    @property
    def notify_channel(self) -> str:
        """Where each committed verdict is announced (`LISTEN` on it; `verdicts` says how)."""
        return notify_channel_for(self._schema)

    async def start(self) -> None:
        if self._pool is None:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=1,
                max_size=self._pool_size,
                server_settings={
                    "search_path": quote_ident(self._schema),
                    "application_name": f"toolledger-store-{os.getpid()}",
                    # A projector frozen inside a batch (SIGSTOP, a VM stall) holds its
                    # partition's offset row lock; PostgreSQL ends such a session after 10 s so
                    # the successor can go on, and a waiter gives up on a lock after 5 s
                    # (treated as losing the partition) instead of stalling every partition.
                    "idle_in_transaction_session_timeout": "10000",
                    "lock_timeout": "5000",
                },
                init=_init_connection,
                reset=_keep_session,
            )
        try:
            async with self._pool.acquire() as conn:
                await migrate(conn, self._schema, create=self._create)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the pool: gracefully within `CLOSE_TIMEOUT`, else by terminating it (a
        connection still held by a stuck query must not make closing hang forever)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT)
            except TimeoutError:
                log.warning("the ledger pool did not close in %ss; terminating it", CLOSE_TIMEOUT)
                pool.terminate()

    @property
    def _db(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._pool is None:
            raise StoreError(
                f"the PostgreSQL ledger ({self._schema}) is not started: await start()"
            )
        return self._pool

    async def record_halt(self, partition: int, offset: int, reason: str | None) -> None:
        if reason is None:
            await self._db.execute(_HALT_CLEARED, partition)
        else:  # only while the row is still at the halt: an owner since then has moved it
            await self._db.execute(_HALTED, partition, offset, reason)

    async def bind_log(self, identity: LogIdentity) -> dict[int, PartitionState]:
        async with self._db.acquire() as conn, conn.transaction():
            # Serializes two projectors binding a new ledger at once: the second one waits,
            # then sees (and checks) what the first one recorded instead of adding to it.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                f"toolledger.bind_log:{self._schema}",
            )
            await conn.execute(_BIND, identity.epoch, identity.partitions)
            states = {s.partition: s for s in map(_state, await conn.fetch(_STATES))}
        check_identity(identity, states)
        return states

    async def partition_state(self, partition: int) -> PartitionState | None:
        row = await self._db.fetchrow(f"{_STATES} WHERE partition = $1", partition)
        return None if row is None else _state(row)

    async def partition_leases(self) -> list[PartitionLease]:
        async with self._db.acquire() as conn:
            return await read_leases(conn)

    async def apply_written(
        self,
        partition: int,
        start_offset: int,
        next_offset: int,
        items: Sequence[Positioned | DeadLetter],
    ) -> AppliedBatch:
        check_batch(partition, start_offset, next_offset, items)
        with gc_paused():
            return await self._apply((partition, start_offset, next_offset), items, None)

    async def apply_folded(
        self, partition: int, start_offset: int, next_offset: int, folded: Sequence[Folded]
    ) -> AppliedBatch:
        items = [f.item for f in folded]
        check_batch(partition, start_offset, next_offset, items)
        with gc_paused():
            return await self._apply((partition, start_offset, next_offset), items, folded)

    async def _apply(
        self,
        position: tuple[int, int, int],
        items: Sequence[Positioned | DeadLetter],
        folded: Sequence[Folded] | None,
    ) -> AppliedBatch:
        """Write a batch: folded here, or (`folded`) as a leader folded it."""
        partition = position[0]
        async with self._db.acquire() as conn:
            if len(items) <= SMALL_BATCH:
                try:
                    return await self._apply_small(conn, position, items, folded)
                except BaseException:
                    self._known.pop(partition, None)  # whatever happened, read it again
                    raise
            self._known.pop(partition, None)
            async with conn.transaction():
                if not self._synchronous_apply:
                    await conn.execute("SET LOCAL synchronous_commit TO off")
                if folded is not None:
                    return await self._apply_large_folded(conn, position, folded)
                return await self._apply_large(conn, position, items)

    async def _apply_small(
        self,
        conn: Conn,
        position: tuple[int, int, int],
        items: Sequence[Positioned | DeadLetter],
        folded: Sequence[Folded] | None,
    ) -> AppliedBatch:
        """Fold on what this store knows of the partition and write in one statement; if it
        knew nothing (a partition just taken) or an assumption failed, load, then fold again.

        A batch a leader folded reads only its keys' chain heads: what this store does not
        know of them is assumed absent even right after taking the partition (most of a
        leader's keys are new), and loaded only when the write finds one."""
        partition, start_offset, next_offset = position
        known = self._known.pop(partition, None)
        if folded is not None and (known is None or known.next_offset != start_offset):
            known = KnownRows(start_offset)
        if known is not None and known.next_offset == start_offset:
            reads = known.reads(items) if folded is None else known.heads_for(history_keys(folded))
            applied = await self._write_small(conn, position, items, reads, folded)
            if applied is not None:
                self._remember(partition, next_offset, known, reads, applied)
                return applied[0]
            log.debug("partition %d: a row assumed absent is in the ledger; loading", partition)
        if folded is None:
            reads = Reads(*await _load(conn, items))
        else:
            wanted = history_keys(folded)
            reads = Reads({}, {}, set(), await _load_heads(conn, wanted))
        applied = await self._write_small(conn, position, items, reads, folded)
        if applied is None:  # it assumed nothing, so only the CAS can have missed
            raise OffsetConflict(partition, start_offset, await conn.fetchval(_OFFSET, partition))
        loaded = KnownRows(next_offset)
        if folded is None:
            loaded.read_all(items, reads)
        else:
            loaded.heads.update(dict.fromkeys(absent(wanted, reads.heads)))
        self._remember(partition, next_offset, loaded, reads, applied)
        return applied[0]

    def _remember(
        self,
        partition: int,
        next_offset: int,
        known: KnownRows,
        reads: Reads,
        applied: tuple[AppliedBatch, BatchOutcome],
    ) -> None:
        known.learn(next_offset, reads, applied[1])
        if known.size() <= KNOWN_LIMIT:
            self._known[partition] = known

    async def _write_small(
        self,
        conn: Conn,
        position: tuple[int, int, int],
        items: Sequence[Positioned | DeadLetter],
        reads: Reads,
        folded: Sequence[Folded] | None,
    ) -> tuple[AppliedBatch, BatchOutcome] | None:
        """Fold `items` on `reads` (or chain what a leader `folded`) and write them in one
        statement; None if an assumption of `reads` failed (nothing written), `OffsetConflict`
        if the CAS missed."""
        partition, start_offset, _ = position
        if folded is None:
            batch = BatchFold(reads.calls, reads.runs, reads.decided, self.verify_keys, reads.heads)
            for item in items:
                batch.apply(item)
            outcome = batch.outcome()
        else:
            outcome = chained(folded, reads.heads)
        texts = outcome.verdict_json
        if texts is None:
            texts = [v.model_dump_json() for v in outcome.verdicts]
        rows = (
            list(map(_history_values, outcome.history)),
            list(map(_verdict_values, outcome.verdicts, outcome.history, texts)),
            list(map(_call_values, outcome.calls)),
            list(map(_run_values, outcome.runs)),
            list(map(_dead_values, outcome.dead_letters)),
        )
        args = self._small.arguments(position, self.notify_channel, rows, reads.assumed)
        try:
            moved = await conn.fetchval(self._small.statement, *args)
        except asyncpg.LockNotAvailableError:
            raise OffsetConflict(partition, start_offset, None) from None
        if moved == 1:
            return AppliedBatch(outcome.verdicts, outcome.history, texts), outcome
        stored = await conn.fetchval(_OFFSET, partition)
        if stored == start_offset and reads.assumed.any():
            return None
        raise OffsetConflict(partition, start_offset, stored)

    async def _cas(self, conn: Conn, position: tuple[int, int, int]) -> None:
        """A large batch's compare-and-set, first in its transaction (it holds the offset row
        to the end); `OffsetConflict` if it misses."""
        partition, start_offset, next_offset = position
        try:
            moved = await conn.execute(_CAS, partition, start_offset, next_offset)
        except asyncpg.LockNotAvailableError:
            raise OffsetConflict(partition, start_offset, None) from None
        if moved != "UPDATE 1":
            raise OffsetConflict(partition, start_offset, await conn.fetchval(_OFFSET, partition))

    async def _apply_large(
        self, conn: Conn, position: tuple[int, int, int], items: Sequence[Positioned | DeadLetter]
    ) -> AppliedBatch:
        """CAS first (holding the offset row), then COPY while folding, then the upserts."""
        await self._cas(conn, position)
        calls, runs, decided, heads = await _load(conn, items)
        batch = BatchFold(calls, runs, decided, self.verify_keys, heads)
        async with _Appender(conn) as appender:
            for at in range(0, len(items), _SLICE):
                for item in items[at : at + _SLICE]:
                    batch.apply(item)
                await appender.offer(batch.history, batch.verdicts)
        await appender.flush(batch.history, batch.verdicts)
        outcome = batch.outcome()
        await self._write_rows(conn, position, outcome)
        return AppliedBatch(outcome.verdicts, outcome.history, appender.verdict_json)

    async def _apply_large_folded(
        self, conn: Conn, position: tuple[int, int, int], folded: Sequence[Folded]
    ) -> AppliedBatch:
        """CAS first, then the chain heads, then COPY and the upserts: nothing to fold."""
        await self._cas(conn, position)
        outcome = chained(folded, await _load_heads(conn, history_keys(folded)))
        appender = _Appender(conn)
        await appender.flush(outcome.history, outcome.verdicts, outcome.verdict_json)
        await self._write_rows(conn, position, outcome)
        return AppliedBatch(outcome.verdicts, outcome.history, appender.verdict_json)

    async def _write_rows(
        self, conn: Conn, position: tuple[int, int, int], outcome: BatchOutcome
    ) -> None:
        """A large batch's changed calls, runs and dead letters, and its notifications."""
        partition, start_offset, next_offset = position
        if outcome.calls:
            await conn.copy_records_to_table(
                _BATCH_CALLS, records=map(_call_values, outcome.calls), columns=_CALL_TYPES
            )
            await conn.execute(_UPSERT_CALLS)
        if outcome.runs:
            await conn.executemany(_UPSERT_RUN, map(_run_values, outcome.runs))
        if outcome.dead_letters:
            await conn.executemany(_INSERT_DEAD_LETTER, map(_dead_values, outcome.dead_letters))
        if outcome.verdicts:
            await conn.execute(_NOTIFY, self.notify_channel, partition, start_offset, next_offset)

    async def get_call(self, key: str) -> CallRecord | None:
        row = await self._db.fetchrow(_GET_CALL, key)
        return None if row is None else CallRecord.model_validate(dict(row))

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._db.fetchrow(_GET_RUN, run_id)
        return None if row is None else RunRecord.model_validate(dict(row))

    async def list_runs(
        self,
        statuses: Collection[str],
        tenant_id: str | None = None,
        limit: int = 500,
        *,
        resume_failed: bool = False,
    ) -> list[RunRecord]:
        rows = await self._db.fetch(_LIST_RUNS, sorted(statuses), tenant_id, limit, resume_failed)
        return [RunRecord.model_validate(dict(row)) for row in rows]

    async def history(self, key: str) -> list[HistoryEntry]:
        rows = await self._db.fetch(_HISTORY, key)
        return [HistoryEntry.model_validate(dict(row)) for row in rows]

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        sql, args = _list_calls_sql(query)
        rows = await self._db.fetch(sql, *args)
        return [CallRecord.model_validate(dict(row)) for row in rows]

    async def call_stats(self, now: datetime, older_than: Sequence[float]) -> CallStats:
        by_status = {r["status"]: int(r["n"]) for r in await self._db.fetch(_COUNT_BY_STATUS)}
        unsettled: dict[tuple[str, float], int] = {
            (s, float(b)): 0 for s in sorted(UNSETTLED) for b in older_than
        }
        rows = await self._db.fetch(
            _COUNT_UNSETTLED, now, [float(b) for b in older_than], sorted(UNSETTLED)
        )
        for row in rows:
            unsettled[(row["status"], float(row["bound"]))] = int(row["n"])
        resume_failed = await self._db.fetchval(_COUNT_RESUME_FAILED)
        return CallStats(by_status=by_status, unsettled=unsettled, resume_failed=resume_failed)

    async def status_counts(self, tenant_id: str | None, deadline_before: datetime) -> StatusCounts:
        rows = await self._db.fetch(_COUNT_TENANT, tenant_id, deadline_before)
        overdue = sum(int(r["overdue"]) for r in rows if r["status"] == "started")
        return StatusCounts(by_status={r["status"]: int(r["n"]) for r in rows}, overdue=overdue)

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        rows = await self._db.fetch(_VERDICTS, list(event_ids))
        found = (Verdict.model_validate_json(row["verdict_json"]) for row in rows)
        return {v.event_id: v for v in found}

    async def dead_letters(self) -> list[DeadLetter]:
        rows = await self._db.fetch(
            'SELECT partition, "offset", run_id, reason, payload FROM dead_letters '
            'ORDER BY partition, "offset"'
        )
        return [
            DeadLetter(r["partition"], r["offset"], r["run_id"], r["reason"], r["payload"])
            for r in rows
        ]

    async def snapshot(self) -> LedgerSnapshot:
        # One repeatable-read transaction: the four reads see one consistent ledger. The whole
        # ledger becomes objects at once, which is what `gc_paused` is for.
        with gc_paused():
            async with (
                self._db.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                calls = await conn.fetch(_ALL_CALLS)
                runs = await conn.fetch(_ALL_RUNS)
                history = await conn.fetch(_ALL_HISTORY)
                dead = await conn.fetchval("SELECT count(*) FROM dead_letters")
            return LedgerSnapshot(
                calls={r["key"]: CallRecord.model_validate(dict(r)) for r in calls},
                runs={r["run_id"]: RunRecord.model_validate(dict(r)) for r in runs},
                history=[HistoryEntry.model_validate(dict(r)) for r in history],
                dead_letters=int(dead),
            )

    async def digest(self) -> str:
        # The same digest as the port's; hashing every row of a snapshot allocates as much again.
        with gc_paused():
            return (await self.snapshot()).digest()

    async def facts_since(self, partition: int, offset: int, limit: int) -> list[Fact]:
        rows = await self._db.fetch(_FACTS, partition, offset, limit)
        return [
            Fact(
                partition=r["partition"],
                offset=r["offset"],
                verdict=Verdict.model_validate_json(r["verdict_json"]),
                event_json=r["event_json"],
            )
            for r in rows
        ]

    async def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        if not blobs:
            return
        digests = list(blobs)
        await self._db.execute(
            _PUT_BLOBS, digests, [len(blobs[d]) for d in digests], [blobs[d] for d in digests]
        )

    async def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        if not digests:
            return {}
        rows = await self._db.fetch(_GET_BLOBS, list(digests))
        return {row["digest"]: bytes(row["data"]) for row in rows}

    async def facts_published(self, partition: int) -> int:
        published = await self._db.fetchval(_FACTS_PUBLISHED, partition)
        return 0 if published is None else int(published)

    async def mark_facts_published(self, partition: int, offset: int) -> None:
        await self._db.execute(_MARK_FACTS_PUBLISHED, partition, offset)

    async def register_verify_keys(self) -> VerifyKeys:
        async with self._db.acquire() as conn:
            return await keyring.register(conn, self.verify_keys)

    async def registered_keys(self) -> VerifyKeys:
        return await keyring.registered(self._db)
