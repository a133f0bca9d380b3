"""The one-statement write of a small batch, against a real PostgreSQL.

The contract suite already holds the small and the large batch to the reference fold; these
cases guard what only the one-statement shape can get wrong: run arrays sent as literals, and a
compare-and-set that misses after the rows were already prepared.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests import builders as b
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.log import LogIdentity
from toolledger.events.models import (
    CallReserved,
    Event,
    RunCheckpointed,
    RunStarted,
    args_digest,
)
from toolledger.projections import postgres
from toolledger.projections.batch_sql import array_literal
from toolledger.projections.postgres import SMALL_BATCH, PostgresLedger
from toolledger.projections.store import OffsetConflict

T0 = datetime(2026, 1, 1, tzinfo=UTC)
IDENTITY = LogIdentity("toolledger.events", uuid.uuid4(), 1)
AWKWARD = ("plain", 'a "quoted" id', "back\\slash", "{braces},commas", "NULL", "", " spaced ")


@pytest.fixture
async def ledger(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresLedger]:
    store = PostgresLedger(pg_dsn, pg_schema)
    await store.start()
    await store.bind_log(IDENTITY)
    try:
        yield store
    finally:
        await store.close()


async def test_array_literals_read_back_as_the_strings_sent(pg_dsn: str) -> None:
    """A checkpoint's tool_call_ids travel as an array literal; any string must survive it."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        for items in ((), AWKWARD, ("é", "\t", "x,y")):
            assert await conn.fetchval("SELECT $1::text::text[]", array_literal(items)) == list(
                items
            )
    finally:
        await conn.close()


async def test_a_small_batch_round_trips_awkward_checkpoint_ids(ledger: PostgresLedger) -> None:
    """Quotes, backslashes, braces and commas in tool_call_ids must not change the run row."""
    started = RunStarted(key="r1", run_id="r1", tenant_id="acme", occurred_at=T0)
    checkpoint = RunCheckpointed(
        key="r1",
        run_id="r1",
        tenant_id="acme",
        occurred_at=T0 + timedelta(seconds=1),
        expected_version=0,
        tool_call_ids=AWKWARD,
    )
    items = [Positioned(0, 1, started), Positioned(0, 2, checkpoint)]
    assert len(items) <= SMALL_BATCH
    reference = LedgerFold()
    expected = [v for v in map(reference.apply, items) if v is not None]
    assert await ledger.apply_batch(0, 1, 3, items) == expected
    assert await ledger.get_run("r1") == reference.runs["r1"]
    assert await ledger.digest() == reference.digest()


async def test_a_small_batch_whose_cas_misses_writes_and_announces_nothing(
    ledger: PostgresLedger, pg_dsn: str
) -> None:
    """The write statement's inserts and notifications all hang on the CAS: a zombie's batch,
    folded against state that is no longer current, must leave no trace at all."""
    heard: list[str] = []
    listener = await asyncpg.connect(pg_dsn)
    await listener.add_listener(ledger.notify_channel, lambda *args: heard.append(str(args[3])))
    try:
        r = CallReserved(
            key="r1:c1",
            run_id="r1",
            tool_call_id="c1",
            tenant_id="acme",
            occurred_at=T0,
            tool="billing.issue_credit",
            args_digest=args_digest({}),
            deadline=T0 + timedelta(seconds=30),
        )
        before = await ledger.digest()
        with pytest.raises(OffsetConflict) as err:
            await ledger.apply_batch(0, 5, 6, [Positioned(0, 5, r)])
        assert (err.value.expected, err.value.actual) == (5, 1)
        assert await ledger.digest() == before
        assert await ledger.verdicts([r.event_id]) == {}
        await listener.execute("SELECT 1")  # a round trip, so a notification would be in
        assert heard == []
    finally:
        await listener.close()


@pytest.mark.parametrize("size", [2, SMALL_BATCH + 10], ids=["small", "large"])
async def test_a_batch_flushed_per_commit_folds_the_same_ledger(
    pg_dsn: str, pg_schema: str, size: int
) -> None:
    """`TOOLLEDGER_PROJECTOR_SYNCHRONOUS_COMMIT=true` only changes when the commit returns:
    both batch shapes write the reference fold's ledger, and the setting holds on the
    connection only inside the batch's transaction (the pool's sessions keep the default)."""
    store = PostgresLedger(pg_dsn, pg_schema, synchronous_apply=True)
    await store.start()
    try:
        await store.bind_log(IDENTITY)
        items = [
            Positioned(0, n + 1, RunStarted(key=f"r{n}", run_id=f"r{n}", tenant_id="acme"))
            for n in range(size)
        ]
        reference = LedgerFold()
        expected = [v for v in map(reference.apply, items) if v is not None]
        assert await store.apply_batch(0, 1, size + 1, items) == expected
        assert await store.digest() == reference.digest()
    finally:
        await store.close()
    relaxed = PostgresLedger(pg_dsn, pg_schema)
    await relaxed.start()
    try:
        more = [
            Positioned(0, size + 1 + n, RunStarted(key=f"s{n}", run_id=f"s{n}", tenant_id="acme"))
            for n in range(size)
        ]
        expected = [v for v in map(reference.apply, more) if v is not None]
        assert await relaxed.apply_batch(0, size + 1, 2 * size + 1, more) == expected
        assert await relaxed.digest() == reference.digest()
        # The pool's one connection folded the batch; what it writes next (blobs) is durable.
        assert await relaxed._db.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await relaxed.close()


class _CountedLoads:
    """Counts the store's loads (the query before a fold) while it runs for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = postgres._load

        async def counted(*args: Any) -> Any:
            self.count += 1
            return await real(*args)

        monkeypatch.setattr(postgres, "_load", counted)


def _positioned(start: int, *events: Event) -> list[Positioned]:
    return [Positioned(0, start + n, e) for n, e in enumerate(events)]


async def test_a_partitions_next_batches_are_written_without_loading_first(
    ledger: PostgresLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a partition's first batch the store folds on what it wrote, so a call's
    reservation and its completion each cost one statement, and the ledger is the reference
    fold's: the known rows are the stored rows."""
    loads = _CountedLoads(monkeypatch)
    reference = LedgerFold()
    offset = 1
    for n in range(4):
        r = b.reserved(f"run{n % 2}", f"c{n}")
        for batch in (_positioned(offset, r), _positioned(offset + 1, b.completed(r), r)):
            expected = [v for v in map(reference.apply, batch) if v is not None]
            assert await ledger.apply_batch(0, offset, offset + len(batch), batch) == expected
            offset += len(batch)
    assert loads.count == 1, "only the partition's first batch loads what it reads"
    assert await ledger.digest() == reference.digest()
    assert await ledger.verdicts([r.event_id]) != {}


async def test_rows_another_owner_wrote_are_loaded_not_assumed_absent(
    ledger: PostgresLedger, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover: the partition's previous owner wrote a call and a run this store never saw.
    Assuming them absent would reserve the key twice and fork the history chain; the write's
    probes find them, nothing is written, and the batch is folded again after a load."""
    reference = LedgerFold()
    first = b.reserved("run1", "c1")
    other = PostgresLedger(pg_dsn, pg_schema)
    await other.start()
    try:
        batch = _positioned(1, first)
        reference_verdicts = [v for v in map(reference.apply, batch) if v is not None]
        assert await other.apply_batch(0, 1, 2, batch) == reference_verdicts
    finally:
        await other.close()
    loads = _CountedLoads(monkeypatch)
    unrelated = b.reserved("run2", "c1")
    batch = _positioned(2, unrelated)
    expected = [v for v in map(reference.apply, batch) if v is not None]
    assert await ledger.apply_batch(0, 2, 3, batch) == expected
    assert loads.count == 1
    # run1 and its call were written by the other store: this one knows nothing of them.
    again = b.reserved("run1", "c1")  # the same key, another reservation: must be rejected
    done = b.completed(first)
    batch = _positioned(3, again, done, first)  # `first` resent: already decided
    expected = [v for v in map(reference.apply, batch) if v is not None]
    assert [v.accepted for v in expected] == [False, True]
    assert await ledger.apply_batch(0, 3, 6, batch) == expected
    assert loads.count == 2, "the failed assumption made it load"
    assert await ledger.digest() == reference.digest()
    snapshot = await ledger.snapshot()
    assert snapshot.history == reference.history


async def test_a_failed_batch_forgets_what_the_store_knew(
    ledger: PostgresLedger, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie: another store committed to the partition meanwhile. This store's next batch,
    folded on what it knew, misses the CAS and writes nothing; after it nothing it knew is
    trusted, so the batch after loads what it reads (and sees the other store's completion)."""
    r = b.reserved("run1", "c1")
    await ledger.apply_batch(0, 1, 2, _positioned(1, r))
    other = PostgresLedger(pg_dsn, pg_schema)
    await other.start()
    try:
        await other.apply_batch(0, 2, 3, _positioned(2, b.completed(r)))
    finally:
        await other.close()
    loads = _CountedLoads(monkeypatch)
    with pytest.raises(OffsetConflict):
        await ledger.apply_batch(0, 2, 3, _positioned(2, b.completed(r)))
    assert loads.count == 0, "the zombie's batch was folded on what it knew"
    late = b.completed(r, result='{"late":true}')
    [verdict] = await ledger.apply_batch(0, 3, 4, _positioned(3, late))
    assert loads.count == 1
    assert not verdict.accepted, "the completion the other store wrote is read, not forgotten"


async def test_a_partition_known_past_the_limit_is_loaded_again(
    ledger: PostgresLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a store knows is bounded (`KNOWN_LIMIT` entries per partition): past it the next
    batch loads what it reads, and the ledger is still the reference fold's."""
    monkeypatch.setattr(postgres, "KNOWN_LIMIT", 8)
    loads = _CountedLoads(monkeypatch)
    reference = LedgerFold()
    offset = 1
    for n in range(3):  # each batch adds a call, a run, two heads and an event_id: 5 entries
        batch = _positioned(offset, b.reserved(f"run{n}", "c1"))
        expected = [v for v in map(reference.apply, batch) if v is not None]
        assert await ledger.apply_batch(0, offset, offset + 1, batch) == expected
        offset += 1
    assert loads.count == 2, "the first batch, and the one after the limit was passed"
    assert await ledger.digest() == reference.digest()
