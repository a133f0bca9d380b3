"""Verdicts delivered by their notifications, against a real PostgreSQL.

A small batch's statement announces each verdict with the verdict itself, which a waiter takes
instead of reading the `verdicts` table (`toolledger.projections.verdicts` says why that is
safe); a large batch (catch-up) announces event_ids, on which waiters read. These cases guard
what that can get wrong: a delivered verdict that differs from the stored one, a verdict too
large for a payload that fails the batch or is lost instead of read, a catch-up's waiters left
without a hint, and a notification nobody heard.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest

from tests.builders import completed, reserved
from toolledger.events.fold import Positioned
from toolledger.events.log import LogIdentity
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.projections.postgres import SMALL_BATCH, PostgresLedger
from toolledger.projections.verdicts import (
    NOTIFY_PAYLOAD_LIMIT,
    PostgresNotifications,
    VerdictSource,
    VerdictWaiter,
)

IDENTITY = LogIdentity("toolledger.events", uuid.uuid4(), 1)
LARGE = SMALL_BATCH + 1


class _CountedReads(VerdictSource):
    """The store's verdicts, counting the reads the waiter makes."""

    def __init__(self, store: PostgresLedger) -> None:
        self._store = store
        self.reads = 0

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        self.reads += 1
        return await self._store.verdicts(event_ids)


@dataclass
class _Scene:
    store: PostgresLedger
    reads: _CountedReads
    waiter: VerdictWaiter
    next_offset: int = 1

    async def apply(self, events: Sequence[Event]) -> None:
        start, self.next_offset = self.next_offset, self.next_offset + len(events)
        items = [Positioned(0, start + i, e) for i, e in enumerate(events)]
        await self.store.apply_batch(0, start, self.next_offset, items)

    async def verdicts_of(self, events: Sequence[Event]) -> list[Verdict]:
        """Apply `events` in one batch while their waits are registered, as commands do."""
        expected = [(e.event_id, self.waiter.expect(e.event_id)) for e in events]
        try:
            await self.apply(events)
        except BaseException:
            for event_id, fut in expected:
                self.waiter.discard(event_id, fut)
            raise
        return list(await asyncio.gather(*(self.waiter.wait(i, 10, fut) for i, fut in expected)))


@pytest.fixture
async def store(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresLedger]:
    ledger = PostgresLedger(pg_dsn, pg_schema)
    await ledger.start()
    await ledger.bind_log(IDENTITY)
    try:
        yield ledger
    finally:
        await ledger.close()


@pytest.fixture
async def listening(pg_dsn: str, store: PostgresLedger) -> AsyncIterator[_Scene]:
    """A waiter that polls only once a minute, so within a test its verdicts come from
    notifications (or from the read a bare hint asks for)."""
    reads = _CountedReads(store)
    waiter = VerdictWaiter(reads, poll_interval=60)
    listener = PostgresNotifications(pg_dsn, store.notify_channel, waiter)
    await listener.start()
    await waiter.start()
    try:
        yield _Scene(store, reads, waiter)
    finally:
        await waiter.close()
        await listener.close()


async def test_a_verdict_delivered_by_its_notification_equals_the_stored_one(
    listening: _Scene,
) -> None:
    """A waiter handed the notification's verdict must hold exactly what the `verdicts` table
    holds for that event, and must not have read the table to get it."""
    events: list[Event] = [reserved("r1", "c1"), reserved("r2", "c1")]
    got = await listening.verdicts_of(events)
    stored = await listening.store.verdicts([e.event_id for e in events])
    assert got == [stored[e.event_id] for e in events]
    assert all(v.accepted for v in got)
    assert listening.reads.reads == 0


async def test_a_large_batch_announces_event_ids_and_its_waiters_read_their_verdicts(
    listening: _Scene,
) -> None:
    """A catch-up batch sends hints, not verdicts: each of its waiters must still get the
    stored verdict, by a read the hint asks for."""
    events: list[Event] = [reserved(f"r{i}", "c1") for i in range(LARGE)]
    got = await listening.verdicts_of(events)
    stored = await listening.store.verdicts([e.event_id for e in events])
    assert got == [stored[e.event_id] for e in events]
    assert listening.reads.reads >= 1


async def test_a_verdict_too_large_for_a_payload_is_announced_by_its_event_id_and_read(
    listening: _Scene,
) -> None:
    """PostgreSQL refuses a payload of 8000 bytes: a verdict that big must neither fail the
    projector's batch nor be lost, but be announced by its event_id and read from the table.

    Its result is mostly `é`: fewer than 8000 characters, more than 8000 bytes, so a limit
    counted in characters would still fail the batch."""
    first = reserved("big", "c1")
    await listening.apply([first])
    result = json.dumps("é" * 4500, ensure_ascii=False)
    big = completed(first, result=result)
    small = reserved("small", "c1")
    events: list[Event] = [big, small]
    got = await listening.verdicts_of(events)
    stored = await listening.store.verdicts([e.event_id for e in events])
    assert got == [stored[e.event_id] for e in events]
    verdict = stored[big.event_id]
    assert verdict.accepted and verdict.call is not None and verdict.call.result_json == result
    assert len(verdict.model_dump_json()) < NOTIFY_PAYLOAD_LIMIT
    assert len(verdict.model_dump_json().encode()) > NOTIFY_PAYLOAD_LIMIT
    assert listening.reads.reads >= 1


async def test_a_verdict_whose_notification_nobody_heard_is_found_by_the_poll(
    store: PostgresLedger,
) -> None:
    """A process that missed the notification (not listening, or its LISTEN session was down
    at the commit) must still get the verdict, from its timer's read of the table."""
    reads = _CountedReads(store)
    waiter = VerdictWaiter(reads, poll_interval=0.05)
    await waiter.start()
    try:
        scene = _Scene(store, reads, waiter)
        event = reserved("unheard", "c1")
        [verdict] = await scene.verdicts_of([event])
        assert verdict == (await store.verdicts([event.event_id]))[event.event_id]
        assert reads.reads >= 1
    finally:
        await waiter.close()
