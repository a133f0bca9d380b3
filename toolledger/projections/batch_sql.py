"""The columns of the projected tables, and the statements `PostgresLedger.apply_batch` sends.

`apply_batch` has two shapes (`toolledger.projections.postgres` picks one by batch size):

- **A large batch** (catch-up) is one transaction: the offset compare-and-set, then COPY while
  Python folds, then the upserts. Round trips do not matter there; overlapping does.
- **A small batch** (a live projector's usual fetch: a few requests) is what every command
  waits for, so it takes two round trips and no explicit transaction. `LOAD` reads the calls,
  runs and decided event_ids the batch names, in one statement (one snapshot). Python folds.
  `SmallBatch.statement` then writes everything in one statement: a data-modifying CTE moves
  the offset by compare-and-set, and every INSERT and every `pg_notify` is conditioned on that
  CTE having returned its row. If the CAS misses, the statement writes and announces nothing;
  if it hits, rows, history, verdicts, dead letters, the offset and the notifications commit
  together, as that statement's own transaction.

A small batch announces each new verdict with the verdict itself when it fits a notification
payload (`toolledger.projections.verdicts` says why that is safe), else with its event_id alone;
its waiters are the ones a call's latency depends on. A large batch announces event_ids only
(`toolledger.projections.postgres` says why).

Loading before the compare-and-set is exact, not optimistic: a partition's rows only change in a
statement whose CAS moves that partition's offset forward, offsets never move back, and the
caller learned `start_offset` from a committed state. So if the CAS finds `start_offset` at the
write, nothing of this partition committed between the load and the write, and the batch was
folded against exactly the state it is applied to. A racing writer that holds the offset row
makes the CAS wait, then re-check the committed row and miss (or give up after `lock_timeout`).

Array columns (`runs.checkpoint_calls`, `runs.abandoned`) cannot travel in a two-dimensional
unnest, so they are sent as PostgreSQL array literals and cast back to `text[]` in the statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncpg

from toolledger.events.fold import HistoryEntry
from toolledger.events.records import CallRecord, RunRecord
from toolledger.projections.migrations import quote_ident
from toolledger.projections.verdicts import NOTIFY_PAYLOAD_LIMIT

CALL_TYPES: dict[str, str] = {
    "key": "text",
    "run_id": "text",
    "tool_call_id": "text",
    "tenant_id": "text",
    "tool": "text",
    "effect": "text",
    "status": "text",
    "version": "integer",
    "reservation_id": "uuid",
    "args_digest": "text",
    "arguments_json": "text",
    "requires_approval": "boolean",
    "deadline": "timestamptz",
    "not_attempted": "boolean",
    "result_json": "text",
    "result_reference": "text",
    "error": "text",
    "settled_by": "text",
    "operator": "text",
    "reason": "text",
    "reconcile_attempts": "integer",
    "contested": "boolean",
    "contested_evidence": "text",
    "arguments_blob": "text",
    "result_blob": "text",
    "created_at": "timestamptz",
    "updated_at": "timestamptz",
}
HISTORY_TYPES: dict[str, str] = {
    "key": "text",
    "event_id": "uuid",
    "event_type": "text",
    "partition": "integer",
    "offset": "bigint",
    "accepted": "boolean",
    "reason": "text",
    "detail": "text",
    "occurred_at": "timestamptz",
    "actor": "text",
    "version": "integer",
    "event_json": "text",
    "chain_hash": "text",
}
RUN_TYPES: dict[str, str] = {
    "run_id": "text",
    "tenant_id": "text",
    "version": "integer",
    "status": "text",
    "agent": "text",
    "checkpoint_calls": "text[]",
    "state_json": "text",
    "state_blob": "text",
    "waiting_on": "text",
    "abandoned": "text[]",
    "quarantined": "boolean",
    "quarantine_reason": "text",
    "updated_at": "timestamptz",
    "resume_error": "text",
}
VERDICT_TYPES: dict[str, str] = {
    "event_id": "uuid",
    "partition": "integer",
    "offset": "bigint",
    "accepted": "boolean",
    "reason": "text",
    "verdict_json": "text",
}
DEAD_LETTER_TYPES: dict[str, str] = {
    "partition": "integer",
    "offset": "bigint",
    "run_id": "text",
    "reason": "text",
    "payload": "bytea",
}

for _model, _fields in (
    (CallRecord, CALL_TYPES),
    (HistoryEntry, HISTORY_TYPES),
    (RunRecord, RUN_TYPES),
):
    if tuple(_model.model_fields) != tuple(_fields):
        raise ImportError(f"{_model.__name__} changed: add a migration and update batch_sql.py")


def _names(columns: Iterable[str], alias: str = "") -> str:
    return ", ".join(alias + quote_ident(c) for c in columns)


def _nulls(types: Mapping[str, str]) -> str:
    return ", ".join(f"NULL::{t}" for t in types.values())


# Built from this module's constant names and types only, never from input (hence S608).
#: Loads what folding a batch reads: $1 call keys, $2 run_ids, $3 event_ids, $4 history keys
#: (the call keys and the run_ids). Each row is `kind` (1 call, 2 run, 3 decided, 4 chain head),
#: then the call's columns, the run's, the event_id, the chain hash; a chain head puts its key in
#: the call's `key` column. It joins unnested arrays instead of `= ANY($1)`: under a cached
#: generic plan the planner may pick a sequential scan that compares every row with every array
#: element. A chain head is the newest history entry of its key, one index probe
#: (`tool_execution_history_key`) per key.
#: One probe of a primary key per wanted key, whatever the planner knows: each lookup is a
#: LATERAL subquery with LIMIT 1 (which the planner cannot flatten into a join), because on a
#: fresh, unanalysed schema (replay, a benchmark, a new ledger catching up) it hashed the whole
#: of `tool_executions` for every batch instead, a cost growing with the ledger (decision 6 of
#: the lean event path: no query may depend on statistics a new schema lacks).
LOAD = (
    f"SELECT 1 AS kind, {_names(CALL_TYPES, 'c.')}, {_nulls(RUN_TYPES)}, NULL::uuid, "  # noqa: S608
    "NULL::text FROM unnest($1::text[]) AS wanted(key) CROSS JOIN LATERAL "
    "(SELECT * FROM tool_executions AS t WHERE t.key = wanted.key LIMIT 1) AS c "
    f"UNION ALL SELECT 2, {_nulls(CALL_TYPES)}, {_names(RUN_TYPES, 'r.')}, NULL::uuid, NULL "
    "FROM unnest($2::text[]) AS wanted(run_id) CROSS JOIN LATERAL "
    "(SELECT * FROM runs AS t WHERE t.run_id = wanted.run_id LIMIT 1) AS r "
    f"UNION ALL SELECT 3, {_nulls(CALL_TYPES)}, {_nulls(RUN_TYPES)}, v.event_id, NULL "
    "FROM unnest($3::uuid[]) AS wanted(event_id) CROSS JOIN LATERAL "
    "(SELECT event_id FROM verdicts AS t WHERE t.event_id = wanted.event_id LIMIT 1) AS v "
    f"UNION ALL SELECT 4, wanted.key, {_nulls(dict(list(CALL_TYPES.items())[1:]))}, "
    f"{_nulls(RUN_TYPES)}, NULL, h.chain_hash FROM unnest($4::text[]) AS wanted(key) "
    "CROSS JOIN LATERAL (SELECT chain_hash FROM tool_execution_history AS t "
    'WHERE t.key = wanted.key ORDER BY partition DESC, "offset" DESC LIMIT 1) AS h'
)


def calls_of_runs(kind: int, runs: str, limit: str) -> str:
    """A branch in `LOAD`'s row shape: up to `limit` calls of each run in the text[] `runs`
    (parameters, e.g. "$2"), by the `tool_executions_run` index, each row tagged `kind`."""
    return (
        f"SELECT {kind}, {_names(CALL_TYPES, 'c.')}, {_nulls(RUN_TYPES)}, NULL::uuid, "  # noqa: S608
        f"NULL::text FROM unnest({runs}::text[]) AS wanted(run_id) CROSS JOIN LATERAL "
        f"(SELECT * FROM tool_executions AS t WHERE t.run_id = wanted.run_id LIMIT {limit}) AS c"
    )


#: The stored verdicts of the event_ids in $1, one primary-key probe each (as `LOAD`'s).
VERDICTS_BY_ID = (
    "SELECT v.verdict_json FROM unnest($1::uuid[]) AS wanted(event_id) CROSS JOIN LATERAL "
    "(SELECT verdict_json FROM verdicts AS t WHERE t.event_id = wanted.event_id LIMIT 1) AS v"
)
_CALLS_AT = slice(1, 1 + len(CALL_TYPES))
_RUNS_AT = slice(_CALLS_AT.stop, _CALLS_AT.stop + len(RUN_TYPES))


def call_columns(row: asyncpg.Record) -> dict[str, Any]:
    """A call's columns from a row shaped as `LOAD`'s (kind first, then the call's columns)."""
    return dict(zip(CALL_TYPES, row[_CALLS_AT], strict=True))


def loaded(
    rows: Iterable[asyncpg.Record],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any], dict[str, str]]:
    """The rows of `LOAD` as call and run column dicts, decided event_ids and chain heads."""
    calls: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    decided: list[Any] = []
    heads: dict[str, str] = {}
    for row in rows:
        kind = row[0]
        if kind == 1:
            calls.append(call_columns(row))
        elif kind == 2:
            runs.append(dict(zip(RUN_TYPES, row[_RUNS_AT], strict=True)))
        elif kind == 3:
            decided.append(row[-2])
        else:
            heads[row[1]] = row[-1]
    return calls, runs, decided, heads


def _notification(event_id: str, verdict_json: str) -> str:
    """The SQL of a verdict's notification payload, from the SQL of its event_id and its JSON:
    `<event_id> <verdict JSON>`, or the event_id alone when that would not fit (PostgreSQL
    refuses a payload of `NOTIFY_PAYLOAD_LIMIT` bytes; the waiter then reads the verdict)."""
    room = NOTIFY_PAYLOAD_LIMIT - len(" ") - 36
    return (
        f"CASE WHEN octet_length({verdict_json}) < {room} "
        f"THEN {event_id}::text || ' ' || {verdict_json} ELSE {event_id}::text END"
    )


def array_literal(items: Sequence[str]) -> str:
    """`items` as a PostgreSQL array literal: every element quoted, `"` and `\\` escaped."""
    quoted = (s.replace("\\", "\\\\").replace('"', '\\"') for s in items)
    return "{" + ",".join(f'"{s}"' for s in quoted) + "}"


@dataclass(frozen=True)
class Assumed:
    """What a batch was folded assuming absent from the ledger, unread: the statement that
    writes it checks each (one index probe apiece) and writes nothing if one is there."""

    #: (table, column, type) of each probe, in the order of the fields below.
    PROBES: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("tool_executions", "key", "text"),
        ("runs", "run_id", "text"),
        ("tool_execution_history", "key", "text"),
        ("verdicts", "event_id", "uuid"),
    )

    calls: Sequence[str] = ()
    runs: Sequence[str] = ()
    histories: Sequence[str] = ()
    verdicts: Sequence[uuid.UUID] = ()

    def any(self) -> bool:
        return bool(self.calls or self.runs or self.histories or self.verdicts)

    def arrays(self) -> list[list[Any]]:
        return [list(self.calls), list(self.runs), list(self.histories), list(self.verdicts)]


class SmallBatch:
    """The one statement that writes a small batch, and its arguments.

    Parameters: $1 partition, $2 start offset, $3 next offset, $4 notify channel, then one
    array per column of history, verdicts, calls, runs and dead letters (in that order), then
    the four `Assumed` arrays. Each verdict is announced, in log order (the order of its rows).
    It returns `moved`: 1 if the CAS hit and every assumption held, else 0 (nothing written).
    """

    TABLES: tuple[tuple[str, Mapping[str, str], str | None], ...] = (
        ("tool_execution_history", HISTORY_TYPES, None),
        ("verdicts", VERDICT_TYPES, None),
        ("tool_executions", CALL_TYPES, "key"),
        ("runs", RUN_TYPES, "run_id"),
        ("dead_letters", DEAD_LETTER_TYPES, None),
    )
    _RUN_ARRAYS = tuple(i for i, t in enumerate(RUN_TYPES.values()) if t.endswith("[]"))

    def __init__(self, *, durable: bool = True) -> None:
        param = 5
        first: dict[str, int] = {}
        writes = []
        for n, (table, types, conflict) in enumerate(self.TABLES):
            writes.append(f"write{n} AS ({_insert(table, types, param, conflict)})")
            first[table] = param
            param += len(types)
        probes = " AND ".join(
            f"NOT EXISTS (SELECT FROM unnest(${param + i}::{kind}[]) AS wanted(v) "  # noqa: S608
            f"CROSS JOIN LATERAL (SELECT 1 FROM {table} AS t WHERE t.{column} = wanted.v "
            "LIMIT 1) AS found)"
            for i, (table, column, kind) in enumerate(Assumed.PROBES)
        )
        parts = [
            "WITH moved AS (UPDATE projection_offsets SET next_offset = $3 "  # noqa: S608
            f"WHERE partition = $1 AND next_offset = $2 AND {probes} RETURNING partition)"
        ]
        if not durable:
            # Local to the statement's own (implicit) transaction, and read when it commits.
            parts.append("relaxed AS (SELECT set_config('synchronous_commit', 'off', true))")
        parts += writes
        ids = first["verdicts"] + list(VERDICT_TYPES).index("event_id")
        texts = first["verdicts"] + list(VERDICT_TYPES).index("verdict_json")
        parts.append(
            f"announced AS (SELECT pg_notify($4, {_notification('v.id', 'v.text')}) "  # noqa: S608
            f"FROM unnest(${ids}::uuid[], ${texts}::text[]) AS v(id, text) "
            "WHERE EXISTS (SELECT FROM moved))"
        )
        self.statement = (
            ", ".join(parts)  # noqa: S608
            + " SELECT (SELECT count(*) FROM moved) AS moved, "
            + "(SELECT count(*) FROM announced) AS announced"
            + ("" if durable else ", (SELECT count(*) FROM relaxed) AS relaxed")
        )

    def arguments(
        self,
        position: tuple[int, int, int],
        channel: str,
        rows: tuple[Sequence[Sequence[Any]], ...],
        assumed: Assumed | None = None,
    ) -> list[Any]:
        """Arguments for `statement`: `position` is (partition, start, next offset), `rows` the
        history, verdict, call, run and dead-letter rows in `TABLES` order, `assumed` what the
        fold took to be absent without reading it (nothing when it read everything)."""
        history, verdicts, calls, runs, dead = rows
        args: list[Any] = [*position, channel]
        for table_rows, (_, types, _) in zip(
            (history, verdicts, calls, [self._run(r) for r in runs], dead),
            self.TABLES,
            strict=True,
        ):
            if table_rows:
                args += [list(column) for column in zip(*table_rows, strict=True)]
            else:
                args += [[] for _ in types]
        return args + (assumed or Assumed()).arrays()

    def _run(self, row: Sequence[Any]) -> list[Any]:
        values = list(row)
        for i in self._RUN_ARRAYS:
            values[i] = array_literal(values[i])
        return values


def _insert(table: str, types: Mapping[str, str], first: int, conflict: str | None) -> str:
    """INSERT ... SELECT FROM unnest($first, ...) that writes only if the CAS hit."""
    arrays = ", ".join(
        f"${first + i}::{'text' if t.endswith('[]') else t}[]" for i, t in enumerate(types.values())
    )
    values = ", ".join(
        f"{quote_ident(c)}::{t}" if t.endswith("[]") else quote_ident(c) for c, t in types.items()
    )
    sql = (
        f"INSERT INTO {table} ({_names(types)}) SELECT {values} "  # noqa: S608
        f"FROM unnest({arrays}) AS r({_names(types)}) WHERE EXISTS (SELECT FROM moved)"
    )
    if conflict is not None:
        updates = ", ".join(
            f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in types if c != conflict
        )
        sql += f" ON CONFLICT ({quote_ident(conflict)}) DO UPDATE SET {updates}"
    return sql
