"""The projector when its broker stops answering and comes back (the in-memory log, made to fail).

A Kafka broker that keeps its data cannot be taken away and brought back in `make test` (the
local broker loses everything on restart, which `tests/integration/test_projector.py` covers):
so the memory log is wrapped to raise `LogError` on every call while an outage lasts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from tests import builders as b
from toolledger.events.codec import encode
from toolledger.events.log import EventLog, LogError, LogIdentity, LogReader, LogRecord, Position
from toolledger.events.memory import MemoryBroker
from toolledger.projections.facts import FactsPublisher, facts_in
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.ownership import MemoryPartitionLocks
from toolledger.projections.projector import Projector


class _Outage:
    def __init__(self) -> None:
        self.on = False
        self.refused = 0

    def check(self) -> None:
        if self.on:
            self.refused += 1
            raise LogError("broker unreachable (test outage)")


class _FlakyReader(LogReader):
    def __init__(self, inner: LogReader, outage: _Outage) -> None:
        self._inner, self._outage = inner, outage

    async def assign(self, positions: Mapping[int, int]) -> None:
        self._outage.check()
        await self._inner.assign(positions)

    async def fetch(self, max_wait: float, max_records: int = 10_000) -> dict[int, list[LogRecord]]:
        self._outage.check()
        return await self._inner.fetch(max_wait, max_records)

    async def close(self) -> None:
        await self._inner.close()


class _FlakyLog(EventLog):
    def __init__(self, inner: EventLog, outage: _Outage) -> None:
        self._inner, self._outage = inner, outage
        self.topic = inner.topic

    async def start(self) -> None:
        await self._inner.start()

    async def close(self) -> None:
        await self._inner.close()

    async def ensure_topic(self, partitions: int) -> LogIdentity:
        return await self._inner.ensure_topic(partitions)

    async def ensure_exists(self, partitions: int) -> None:
        await self._inner.ensure_exists(partitions)

    async def create_topic(self, partitions: int) -> bool:
        return await self._inner.create_topic(partitions)

    async def identity(self) -> LogIdentity:
        self._outage.check()
        return await self._inner.identity()

    async def partition_count(self) -> int:
        self._outage.check()
        return await self._inner.partition_count()

    async def append(
        self,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        *,
        hint: bool = True,
    ) -> Position:
        self._outage.check()
        return await self._inner.append(key, value, headers, hint=hint)

    def reader(self) -> LogReader:
        return _FlakyReader(self._inner.reader(), self._outage)


async def _until(condition: object, what: str, timeout: float = 5.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_broker_outage_stands_the_projector_down_and_it_resumes_when_it_answers() -> None:
    """The projector must not exit on a broker that stops answering: it releases its
    partitions, waits, takes them again when the log answers with the same identity, and
    projects everything once, facts included (at least once, so counted by event_id)."""
    broker = MemoryBroker()
    outage = _Outage()
    events = broker.log("toolledger.events")
    await events.ensure_topic(2)
    facts_log = broker.log("toolledger.ledger")
    await facts_log.create_topic(2)
    store = MemoryLedger(verify_keys=b.KEYS)
    await store.start()
    locks = MemoryPartitionLocks()
    projector = Projector(
        _FlakyLog(events, outage),
        store,
        locks,
        facts=FactsPublisher(_FlakyLog(facts_log, outage)),
        fetch_wait_ms=5,
        broker_retry=0.05,
    )
    running = asyncio.create_task(projector.run())
    try:
        before = [b.reserved(f"r{n}", "c1") for n in range(6)]
        for event in before:
            await events.append(event.run_id, encode(event))
        await _until(lambda: projector.stats.applied == 6, "the first events")

        outage.on = True
        await _until(lambda: not locks.held(), "the projector to release its partitions")
        after = [b.completed(r) for r in before]
        for outcome in after:
            await events.append(outcome.run_id, encode(outcome))
        await asyncio.sleep(0.2)
        assert not running.done() and projector.stats.applied == 6
        outage.on = False

        await _until(lambda: projector.stats.applied == 12, "the events appended meanwhile")
        assert locks.held() == {0, 1} and not running.done()
    finally:
        projector.stop()
        await running
    assert outage.refused > 0
    event_ids = [e.event_id for e in before] + [e.event_id for e in after]
    verdicts = await store.verdicts(event_ids)
    assert len(verdicts) == 12 and all(v.accepted for v in verdicts.values())
    published: set[str] = set()
    reader = facts_log.reader()
    await reader.assign({0: 0, 1: 0})
    for records in (await reader.fetch(0.05)).values():
        published |= {str(f.verdict.event_id) for r in records for f in facts_in(r.value)}
    await reader.close()
    assert published == {str(e) for e in event_ids}
