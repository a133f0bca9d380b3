"""The leader's reads of PostgreSQL: rows with known provenance, and where leaders are.

`LeaderReads.load` answers a `Needs` (`toolledger.leader.projector_side.partition`) in ONE
statement that also reads the partition's stored next offset, so the rows and the offset come
from one snapshot: the rows are exactly the fold of the log before that offset. That is what
lets the leader decide whether it may use them (the offset is its own last commit) or has been
superseded. It reuses the projector's own load (`batch_sql.LOAD`, one primary-key probe per
wanted row), so the leader reads the rows the projector would read, in the same way.

Registration lives on the ownership row (`projection_offsets.leader_address`, migration 0008)
and is fenced like a batch: an owner registers only while the row's next offset is the one it
took the partition at or committed since, so a zombie cannot point runtimes back at itself.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.leader.projector_side.partition import Loaded, Needs
from toolledger.projections.batch_sql import (
    CALL_TYPES,
    LOAD,
    RUN_TYPES,
    VERDICTS_BY_ID,
    call_columns,
    calls_of_runs,
    loaded,
)
from toolledger.projections.postgres_reads import PostgresReads

#: A run that has a row is read with its calls if it has at most this many: memory then knows
#: every key of it ("Whole runs" in `toolledger.leader.projector_side.partition`). One more is
#: read to tell.
RUN_CALLS_LOADED = 128
_NULLS = ", ".join(f"NULL::{t}" for t in (*CALL_TYPES.values(), *RUN_TYPES.values()))
_RUN_CALLS = 5
#: `LOAD` (calls $1, runs $2, event_ids $3, no chain heads $4) plus, first, a kind-0 row whose
#: last column is partition $5's stored next offset, and kind-5 rows: up to $6 calls of each
#: run in $2. One statement, one snapshot.
PROVENANCE = (
    f"SELECT 0 AS kind, {_NULLS}, NULL::uuid, next_offset::text "  # noqa: S608
    f"FROM projection_offsets WHERE partition = $5 UNION ALL {LOAD} "
    f"UNION ALL {calls_of_runs(_RUN_CALLS, '$2', '$6')}"
)
#: What most batches ask, once their runs and keys are known: only whether their event_ids were
#: decided before (resends). The partition's stored offset (a kind-0 row) and each decided one
#: (kind 3), in one statement as `PROVENANCE` reads them, without its four other branches,
#: which cost PostgreSQL four to five times as much CPU even when they read nothing
#: (BENCHMARKS.md, issue 46).
DECIDED = (
    "SELECT 0 AS kind, NULL::uuid AS event_id, next_offset FROM projection_offsets "
    "WHERE partition = $1 UNION ALL SELECT 3, v.event_id, NULL FROM unnest($2::uuid[]) "
    "AS wanted(event_id) CROSS JOIN LATERAL (SELECT event_id FROM verdicts AS t "
    "WHERE t.event_id = wanted.event_id LIMIT 1) AS v"
)
REGISTER = (
    "UPDATE projection_offsets SET leader_address = $2 WHERE partition = $1 AND next_offset = $3 "
    "RETURNING partition"
)
UNREGISTER = (
    "UPDATE projection_offsets SET leader_address = NULL WHERE partition = $1 "
    "AND leader_address = $2 RETURNING partition"
)
LEADERS = "SELECT partition, leader_address FROM projection_offsets"


class LeaderReads(PostgresReads):
    """`PostgresReads` plus the leader's provenance-checked load and its registration."""

    async def load(self, partition: int, needs: Needs, generation: int) -> Loaded:
        """The rows `needs` names and the stored offset of `partition`, read together."""
        if not needs.keys and not needs.runs:
            return await self._decided(partition, needs, generation)
        rows = await self._fetch(
            PROVENANCE,
            list(needs.keys),
            list(needs.runs),
            list(needs.event_ids),
            [],
            partition,
            RUN_CALLS_LOADED + 1,
        )
        stored = [int(row[-1]) for row in rows if row[0] == 0]
        if not stored:
            raise LookupError(f"the ledger has no offset row for partition {partition}")
        calls, runs, decided, _heads = loaded(row for row in rows if row[0] not in (0, _RUN_CALLS))
        of_runs = [call_columns(row) for row in rows if row[0] == _RUN_CALLS]
        per_run = Counter(c["run_id"] for c in of_runs)
        whole = frozenset(r["run_id"] for r in runs if per_run[r["run_id"]] <= RUN_CALLS_LOADED)
        calls.extend(c for c in of_runs if c["run_id"] in whole)
        return Loaded(
            stored=stored[0],
            needs=needs,
            calls={c["key"]: CallRecord.model_validate(c) for c in calls},
            runs={r["run_id"]: RunRecord.model_validate(r) for r in runs},
            decided=await self._verdicts(decided),
            generation=generation,
            whole=whole,
        )

    async def _decided(self, partition: int, needs: Needs, generation: int) -> Loaded:
        """`load` of event_ids alone (`DECIDED`)."""
        rows = await self._fetch(DECIDED, partition, list(needs.event_ids))
        stored = [int(row[2]) for row in rows if row[0] == 0]
        if not stored:
            raise LookupError(f"the ledger has no offset row for partition {partition}")
        decided = [row[1] for row in rows if row[0] == 3]
        verdicts = await self._verdicts(decided)
        return Loaded(stored=stored[0], needs=needs, decided=verdicts, generation=generation)

    async def _verdicts(self, decided: list[Any]) -> dict[uuid.UUID, Verdict]:
        """The first verdicts of decided event_ids (resends: their first verdict is the answer)."""
        verdicts: dict[uuid.UUID, Verdict] = {}
        if decided:
            for row in await self._fetch(VERDICTS_BY_ID, decided):
                verdict = Verdict.model_validate_json(row["verdict_json"])
                verdicts[verdict.event_id] = verdict
        return verdicts

    async def register(self, partition: int, address: str | None, at_offset: int) -> bool:
        """Record `address` as the partition's leader, if the row is still at `at_offset`."""
        return bool(await self._fetch(REGISTER, partition, address, at_offset))

    async def unregister(self, partition: int, address: str) -> None:
        """Clear the partition's leader address if it is still `address` (a clean stand-down)."""
        await self._fetch(UNREGISTER, partition, address)

    async def leaders(self) -> dict[int, str | None]:
        """Every partition's registered leader address (None: no leader)."""
        return {int(r["partition"]): r["leader_address"] for r in await self._fetch(LEADERS)}
