"""Idle means idle, on the real broker and database: readers back off, and hints wake them.

A reader that finds nothing waits longer and longer between fetches, up to its bound
(`toolledger.events.pacing`); whoever appends hints the partition's owner so the wait ends at
once (`toolledger.projections.hints`). These tests guard the three ways that can go wrong: a
hint that does not wake a backed-off reader (every call after an idle spell waits the bound),
a record nobody hinted that is never read or later than the bound, and a back-off that does not
end when records arrive (a busy reader that keeps waiting). Each waits until the reader is in
the middle of a long wait before appending, so a record read at once was read because of what
the test checks, not because a fetch happened to be due.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tests import builders as b
from tests.integration.procs import until
from tests.isolated import Isolated, running_stack
from toolledger.api.app import close_stack
from toolledger.events.kafka import KafkaLog, KafkaReader
from toolledger.events.log import LogReader, partition_for
from toolledger.events.pacing import IdleBackoff
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.settings import ProjectorSettings
from toolledger.wiring.leader import leader_port
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

#: The idle bound of these tests: long enough that a record read well before it was not read
#: by a fetch that was due anyway.
BOUND = 2.0
#: How soon a hinted record must be read (the hint's trip and one fetch; a tenth of the wait
#: it would otherwise have had left).
HINTED = 0.6


@dataclass
class _Follower:
    """Fetches in a loop, as the projector does, noting when each record's value arrived."""

    reader: KafkaReader
    seen: dict[bytes, float] = field(default_factory=dict)

    async def follow(self) -> None:
        while True:
            for records in (await self.reader.fetch(0.005)).values():
                for record in records:
                    self.seen[record.value] = time.monotonic()


@asynccontextmanager
async def _following(isolated: Isolated) -> AsyncIterator[tuple[KafkaLog, _Follower]]:
    """A one-partition topic and a reader of it that backs off straight to `BOUND`."""
    log = KafkaLog(isolated.kafka_bootstrap, f"{isolated.topic_prefix}idle", idle_bound=BOUND)
    await log.start()
    await log.ensure_topic(1)
    reader = log.reader()
    assert isinstance(reader, KafkaReader)
    reader.backoff = IdleBackoff(BOUND, first=BOUND)
    await reader.assign({0: 1})
    follower = _Follower(reader)
    task = asyncio.create_task(follower.follow())
    try:
        yield log, follower
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await reader.close()
        await log.close()


async def _mid_wait(reader: LogReader) -> None:
    """Return once `reader` has just begun a wait of the whole bound: its last fetch is over
    and the next is `BOUND` seconds away unless something wakes it."""
    assert isinstance(reader, KafkaReader)
    await until(lambda: reader.backoff.delay == BOUND, timeout=10, what="the reader to back off")
    waits = reader.waits
    await until(lambda: reader.waits > waits, timeout=BOUND + 5, what="a fetch after a wait")
    await asyncio.sleep(0.1)  # that fetch is over; the reader waits again


async def _read_after(follower: _Follower, value: bytes, since: float, timeout: float) -> float:
    await until(lambda: value in follower.seen, timeout=timeout, what=f"{value!r} to be read")
    return follower.seen[value] - since


async def test_a_hint_wakes_a_backed_off_reader(isolated: Isolated) -> None:
    """A record appended while the reader waits out its bound, and hinted, must be read at
    once: otherwise every call after an idle spell pays the bound in latency."""
    async with _following(isolated) as (log, follower):
        await _mid_wait(follower.reader)
        appended = time.monotonic()
        await log.append("k", b"hinted")
        follower.reader.wake()
        assert await _read_after(follower, b"hinted", appended, BOUND + 5) < HINTED


async def test_without_a_hint_a_record_is_still_read_within_the_bound(isolated: Isolated) -> None:
    """A hint is only an accelerator: a record nobody hints (a lost notification, a writer
    that sends none) must still be read, by the next fetch the back-off lets through."""
    async with _following(isolated) as (log, follower):
        await _mid_wait(follower.reader)
        appended = time.monotonic()
        await log.append("k", b"unhinted")
        waited = await _read_after(follower, b"unhinted", appended, BOUND + 5)
        assert waited < BOUND + 0.5
        assert waited > HINTED, "read before the wait ended: the test did not test the bound"


async def test_records_end_the_back_off(isolated: Isolated) -> None:
    """A reader that found records after an idle spell must poll at once again, not go on
    waiting the bound between fetches while records flow."""
    async with _following(isolated) as (log, follower):
        await _mid_wait(follower.reader)
        await log.append("k", b"first")
        await _read_after(follower, b"first", time.monotonic(), BOUND + 5)
        assert follower.reader.backoff.delay == 0
        appended = time.monotonic()
        await log.append("k", b"second")  # no hint: only the reset makes it quick
        assert await _read_after(follower, b"second", appended, BOUND + 5) < HINTED


def _settings(isolated: Isolated, **fields: Any) -> ProjectorSettings:
    return isolated.settings(
        ProjectorSettings, verify_keys=b.KEYS, idle_fetch_bound_ms=int(BOUND * 1000), **fields
    )


def _reader_of(stack: LedgerStack) -> LogReader:
    """The in-process projector's reader of its partitions."""
    assert stack.projector is not None
    reader = stack.projector._reader  # the test watches where its wait is
    assert reader is not None
    return reader


@asynccontextmanager
async def _projector_process_stack(settings: ProjectorSettings) -> AsyncIterator[LedgerStack]:
    """The stack `toolledger projector` runs: no LISTEN for verdicts, so nothing it appends
    comes back to it through PostgreSQL; only the leader's own wake-up can reach its reader."""
    stack = await LedgerStack.connect(settings, run_projector=True, listen=False)
    try:
        yield stack
    finally:
        await close_stack(stack)


async def _all_owned(stack: LedgerStack, partitions: int) -> None:
    assert stack.projector is not None
    projector = stack.projector
    await until(
        lambda: len(projector.owned) == partitions, timeout=15, what="every partition owned"
    )


async def test_a_backed_off_projector_reads_a_direct_append_at_once(isolated: Isolated) -> None:
    """A runtime on the direct path appends to Kafka, and the projector that owns the
    partition must hear of it (a notification through PostgreSQL) and read it at once, not at
    the end of its idle wait: the reservation's verdict comes from that read."""
    settings = _settings(isolated)
    async with (
        running_stack(settings) as projecting,
        running_stack(settings, run_projector=False) as runtime,
    ):
        await _all_owned(projecting, settings.partitions)
        await runtime.commands.append_and_await(b.reserved("warm", "c1"), 15)
        await _mid_wait(_reader_of(projecting))
        started = time.monotonic()
        verdict = await runtime.commands.append_and_await(b.reserved("idle", "c1"), 15)
        assert verdict.accepted, verdict.detail
        assert time.monotonic() - started < HINTED


async def test_the_leader_wakes_its_backed_off_projector(isolated: Isolated) -> None:
    """On the fast path the leader answers from memory, but the projection (the rows every
    other reader sees) follows only when the projector takes the leader's records: the leader
    hands them over, so it must wake its projector instead of leaving them to the idle wait."""
    settings = _settings(isolated, leader="auto")
    async with (
        _projector_process_stack(settings) as projecting,
        running_stack(settings, run_projector=False) as runtime,
    ):
        port = leader_port(StackPort(runtime), settings)
        assert isinstance(port, LeaderPort)
        try:
            await _all_owned(projecting, settings.partitions)
            await until(
                lambda: _led(port, settings.partitions), timeout=15, what="every partition led"
            )
            await port.append_and_await(b.reserved("warm", "c1"), 15)
            await _mid_wait(_reader_of(projecting))
            event = b.reserved("idle", "c1")
            started = time.monotonic()
            await port.append_and_await(event, 15)
            assert port.stats["direct"] == 0, "the leader did not answer"
            await until(
                lambda: projecting.store.verdicts([event.event_id]),
                timeout=BOUND + 5,
                what="the projection to commit the leader's record",
                interval=0.005,
            )
            assert time.monotonic() - started < HINTED
        finally:
            await port.close()


async def _led(port: LeaderPort, partitions: int) -> bool:
    found = await port.directory.leaders()
    return len([a for a in found.values() if a]) == partitions


async def test_a_parked_partition_is_not_fetched_and_a_skip_moves_the_reader_on(
    isolated: Isolated,
) -> None:
    """A projector parks the partitions its leader hands over: a parked partition must not be
    fetched at all (fetching back what the leader appended is what cost the broker), the
    others must be, and once it is unparked the reader must start where `skip` put it, not
    hand out again what the caller already has."""
    log = KafkaLog(isolated.kafka_bootstrap, f"{isolated.topic_prefix}parked")
    await log.start()
    reader = log.reader()
    try:
        await log.ensure_topic(2)
        keys = {partition_for(f"run-{i}", 2): f"run-{i}" for i in range(20)}
        await reader.assign({0: 1, 1: 1})
        reader.park({0})
        first = await log.append(keys[0], b"parked-1")
        second = await log.append(keys[0], b"parked-2")
        await log.append(keys[1], b"read-1")
        seen = await _fetched_for(reader, 0.5)
        assert seen == [(1, b"read-1")]
        reader.skip(0, second.offset)
        reader.park(set())
        assert (first.offset, second.offset) == (1, 2)
        assert await _fetched_for(reader, 0.5) == [(0, b"parked-2")]
    finally:
        await reader.close()
        await log.close()


async def _fetched_for(reader: LogReader, seconds: float) -> list[tuple[int, bytes]]:
    """Every record `reader` hands out within `seconds`, as (partition, value)."""
    seen: list[tuple[int, bytes]] = []
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        for partition, records in (await reader.fetch(0.005)).items():
            seen.extend((partition, r.value) for r in records)
    return seen
