"""Coalesced reads (`CallReads`) and waits registered before their append (`VerdictWaiter`).

Both exist for throughput: many runs in flight read their keys and await their verdicts at the
same moments, and one query for all of them replaces one each. Neither may return an older
state than a query of the caller's own would have, lose an error, or leave a waiter behind.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from toolledger.errors import LedgerUnavailable, seconds
from toolledger.events.records import CallRecord, Verdict
from toolledger.projections.reads import CallReads, PointReads
from toolledger.projections.verdicts import VerdictSource, VerdictWaiter, carried

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(key: str, status: str = "started") -> CallRecord:
    run_id, tool_call_id = key.split(":")
    return CallRecord.model_validate(
        {
            "key": key,
            "run_id": run_id,
            "tool_call_id": tool_call_id,
            "tenant_id": "acme",
            "tool": "unit.noop",
            "effect": "external",
            "status": status,
            "version": 1,
            "reservation_id": uuid.uuid4(),
            "args_digest": "d",
            "arguments_json": "{}",
            "requires_approval": False,
            "deadline": T0 + timedelta(seconds=30),
            "created_at": T0,
            "updated_at": T0,
        }
    )


class GatedReads(PointReads):
    """Reads that are counted and, while `gate` is clear, held."""

    def __init__(self) -> None:
        self.records: dict[str, CallRecord] = {}
        self.queries: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def _read(self, keys: list[str]) -> dict[str, CallRecord]:
        self.queries.append(keys)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return {k: self.records[k] for k in keys if k in self.records}

    async def calls(self, keys: Collection[str]) -> dict[str, CallRecord]:
        return await self._read(sorted(keys))

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        raise AssertionError("CallReads reads no verdicts")

    async def committed(self, partitions: Collection[int]) -> dict[int, int]:
        raise AssertionError("CallReads reads no positions")


async def until(condition: object, what: str) -> None:
    for _ in range(200):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_reads_asked_during_a_query_share_the_next_query_each_getting_its_own_record() -> (
    None
):
    """64 runs reading their keys at once must not cost 64 queries, and no run may be handed
    another key's record."""
    store = GatedReads()
    keys = [f"r{n}:c1" for n in range(64)]
    store.records = {k: record(k) for k in keys[::2]}
    reads = CallReads(store)
    store.gate.clear()
    first = asyncio.create_task(reads.get(keys[0]))
    await until(lambda: store.queries, "the first query")
    rest = [asyncio.create_task(reads.get(k)) for k in keys[1:]]
    await asyncio.sleep(0.01)
    store.gate.set()
    got = await asyncio.gather(first, *rest)
    assert len(store.queries) == 2, store.queries
    assert store.queries[1] == sorted(keys[1:])
    assert [r.key if r is not None else None for r in got] == [
        k if n % 2 == 0 else None for n, k in enumerate(keys)
    ]


async def test_a_read_asked_while_a_query_runs_is_not_answered_by_that_query() -> None:
    """A read must never return a state older than the moment it was asked: a key written
    while an earlier query was in flight is seen by a read asked after the write."""
    store = GatedReads()
    reads = CallReads(store)
    store.gate.clear()
    earlier = asyncio.create_task(reads.get("r1:c1"))
    await until(lambda: store.queries, "the first query")
    store.records["r1:c1"] = record("r1:c1", "completed")
    later = asyncio.create_task(reads.get("r1:c1"))
    await asyncio.sleep(0.01)
    store.gate.set()
    await earlier
    answer = await later
    assert answer is not None and answer.status == "completed"
    assert len(store.queries) == 2


async def test_a_failed_query_fails_every_read_it_answered_and_the_next_reads_query_again() -> None:
    """A database error must reach every coalesced reader (each then fails closed), and must
    not leave the reader stuck for later reads."""
    store = GatedReads()
    reads = CallReads(store)
    store.gate.clear()
    first = asyncio.create_task(reads.get("r1:c1"))
    await until(lambda: store.queries, "the first query")
    others = [asyncio.create_task(reads.get(f"r{n}:c1")) for n in range(2, 5)]
    await asyncio.sleep(0.01)
    store.fail = ConnectionError("PostgreSQL went away")
    store.gate.set()
    for task in (first, *others):
        with pytest.raises(ConnectionError):
            await task
    store.fail = None
    store.records["r9:c1"] = record("r9:c1")
    assert await reads.get("r9:c1") == store.records["r9:c1"]


async def test_a_cancelled_reader_does_not_take_the_others_down() -> None:
    """A caller that gives up while its read is queued must not cancel or break the round
    that answers the other callers."""
    store = GatedReads()
    store.records = {"r2:c1": record("r2:c1")}
    reads = CallReads(store)
    store.gate.clear()
    first = asyncio.create_task(reads.get("r1:c1"))
    await until(lambda: store.queries, "the first query")
    quitter = asyncio.create_task(reads.get("r2:c1"))
    stayer = asyncio.create_task(reads.get("r2:c1"))
    await asyncio.sleep(0.01)
    quitter.cancel()
    store.gate.set()
    assert await first is None
    assert await stayer == store.records["r2:c1"]
    with pytest.raises(asyncio.CancelledError):
        await quitter


class CountingVerdicts(VerdictSource):
    def __init__(self) -> None:
        self.decided: dict[uuid.UUID, Verdict] = {}
        self.reads = 0

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        self.reads += 1
        return {e: self.decided[e] for e in event_ids if e in self.decided}


def verdict(event_id: uuid.UUID) -> Verdict:
    return Verdict(
        event_id=event_id,
        event_type="call_reserved",
        key="r1:c1",
        run_id="r1",
        accepted=True,
        reason="accepted",
        detail="",
    )


async def test_a_wait_registered_before_its_append_reads_only_on_hints_and_ticks() -> None:
    """An expected wait needs no read of its own (its hint cannot come before it), and its
    verdict still arrives on the hint."""
    source = CountingVerdicts()
    waiter = VerdictWaiter(source, poll_interval=60)
    event_id = uuid.uuid4()
    try:
        expected = waiter.expect(event_id)
        waiting = asyncio.create_task(waiter.wait(event_id, 5, expected))
        await asyncio.sleep(0.02)
        assert source.reads == 0
        source.decided[event_id] = verdict(event_id)
        waiter.hint(event_id)
        assert (await waiting).event_id == event_id
        assert source.reads == 1
        assert not waiter._pending
    finally:
        await waiter.close()


async def test_a_delivered_verdict_resolves_its_wait_without_a_read() -> None:
    """A verdict handed over by its notification (or an in-process projector) is the
    committed one: reading it again would only cost the round trip this exists to save."""
    source = CountingVerdicts()
    waiter = VerdictWaiter(source, poll_interval=60)
    event_id = uuid.uuid4()
    try:
        expected = waiter.expect(event_id)
        waiting = asyncio.create_task(waiter.wait(event_id, 5, expected))
        waiter.deliver(verdict(uuid.uuid4()))  # nobody waits for it: no effect
        assert not waiting.done()
        waiter.deliver(verdict(event_id))
        assert (await waiting).event_id == event_id
        assert source.reads == 0
        assert not waiter._pending
    finally:
        await waiter.close()


def test_a_notification_body_is_taken_only_as_the_named_events_verdict() -> None:
    """A bare event_id, a body that does not parse, or a verdict of another event must not be
    handed to the waiter as this event's verdict: each leaves it to read the table."""
    event_id = uuid.uuid4()
    mine = verdict(event_id)
    assert carried(event_id, mine.model_dump_json()) == mine
    assert carried(event_id, "") is None
    assert carried(event_id, '{"event_id": "truncated') is None
    assert carried(event_id, verdict(uuid.uuid4()).model_dump_json()) is None


async def test_a_wait_without_registration_reads_at_once() -> None:
    """An outcome appended earlier may be decided already, with its hint long gone: such a
    wait must read the table itself instead of waiting for the next tick."""
    source = CountingVerdicts()
    waiter = VerdictWaiter(source, poll_interval=60)
    event_id = uuid.uuid4()
    source.decided[event_id] = verdict(event_id)
    try:
        assert (await asyncio.wait_for(waiter.wait(event_id, 5), 2)).event_id == event_id
    finally:
        await waiter.close()


async def test_a_registration_whose_wait_timed_out_or_was_discarded_is_not_kept() -> None:
    """Registrations of events never appended, or of waits that gave up, must not pile up in
    the waiter (every later read would carry them)."""
    waiter = VerdictWaiter(CountingVerdicts(), poll_interval=60)
    try:
        dropped = uuid.uuid4()
        waiter.discard(dropped, waiter.expect(dropped))
        late = uuid.uuid4()
        with pytest.raises(LedgerUnavailable):
            await waiter.wait(late, 0.01, waiter.expect(late))
        assert not waiter._pending
    finally:
        await waiter.close()


async def test_a_verdict_timeout_names_the_projector_and_rounds_its_seconds() -> None:
    """A newcomer without a projector read "no verdict ... within 9.99734s" and no hint that a
    `toolledger projector` must run."""
    waiter = VerdictWaiter(CountingVerdicts(), poll_interval=60)
    try:
        with pytest.raises(LedgerUnavailable) as raised:
            await waiter.wait(uuid.uuid4(), 0.2345)
    finally:
        await waiter.close()
    message = str(raised.value)
    assert "within 0.23s:" in message
    assert "`toolledger projector`" in message
    assert [seconds(9.99734), seconds(2.5), seconds(30.0)] == ["10s", "2.5s", "30s"]
