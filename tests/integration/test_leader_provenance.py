"""The leader's provenance-checked read (`LeaderReads.load`) against a real PostgreSQL.

A run read with its row is read with every call it has, if it has few enough, so that memory
can know the run's other keys do not exist ("Whole runs",
`toolledger.leader.projector_side.partition`). A run with more calls than a load takes must not
be called whole: memory would then answer "no such call" for a key PostgreSQL holds.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests import builders as b
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.log import LogIdentity
from toolledger.leader.projector_side import reads as leader_reads
from toolledger.leader.projector_side.partition import Needs
from toolledger.leader.projector_side.reads import LeaderReads
from toolledger.projections.postgres import PostgresLedger

IDENTITY = LogIdentity("toolledger.events", uuid.uuid4(), 1)


@pytest.fixture
async def reads(pg_dsn: str, pg_schema: str) -> AsyncIterator[tuple[PostgresLedger, LeaderReads]]:
    store = PostgresLedger(pg_dsn, pg_schema)
    await store.start()
    await store.bind_log(IDENTITY)
    leader = LeaderReads(pg_dsn, pg_schema)
    try:
        yield store, leader
    finally:
        await leader.close()
        await store.close()


async def test_a_run_is_read_whole_only_with_all_its_calls(
    reads: tuple[PostgresLedger, LeaderReads], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, leader = reads
    monkeypatch.setattr(leader_reads, "RUN_CALLS_LOADED", 3)
    fold = LedgerFold()
    events = [b.reserved("few", f"c{n}") for n in range(3)]
    events += [b.reserved("many", f"c{n}") for n in range(4)]
    batch = [Positioned(0, 1 + n, e) for n, e in enumerate(events)]
    for item in batch:
        fold.apply(item)
    await store.apply_batch(0, 1, 1 + len(batch), batch)

    loaded = await leader.load(
        0, Needs(keys=frozenset({"few:c9"}), runs=frozenset({"few", "many", "new"})), 0
    )

    assert loaded.stored == 1 + len(batch)
    assert set(loaded.runs) == {"few", "many"}
    assert loaded.whole == {"few"}  # "many" has more calls than a load takes; "new" no row
    assert loaded.calls == {k: fold.calls[k] for k in ("few:c0", "few:c1", "few:c2")}
