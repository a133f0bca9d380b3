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


async def test_event_ids_alone_are_read_with_the_stored_offset_and_their_first_verdicts(
    reads: tuple[PostgresLedger, LeaderReads],
) -> None:
    """A batch whose keys and runs memory knows asks only whether its event_ids were decided
    (`DECIDED`, a statement of its own): that read must still come with the stored offset (its
    provenance), and a resend's answer must be its first verdict, not none."""
    store, leader = reads
    fold = LedgerFold()
    first = b.reserved("r1", "c1")
    batch = [Positioned(0, 1, first), Positioned(0, 2, b.completed(first))]
    verdicts = [fold.apply(item) for item in batch]
    await store.apply_batch(0, 1, 3, batch)
    fresh = uuid.uuid4()

    loaded = await leader.load(0, Needs(event_ids=frozenset({first.event_id, fresh})), 7)

    assert (loaded.stored, loaded.generation) == (3, 7)
    assert loaded.decided == {first.event_id: verdicts[0]}
    assert loaded.calls == {} and loaded.runs == {}
