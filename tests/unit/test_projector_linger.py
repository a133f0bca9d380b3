"""A projector's commits lingering while its follower answers a partition from memory.

`Projector.linger`: records a follower appended itself and handed over (`Proven.own`) for a
partition it carries wait for more and commit together: when the oldest has waited `linger`
seconds, when `batch_size` of them wait, when a record nobody may keep waiting (a foreign
writer's) arrives, or when the projector stops. Other partitions commit each fetch at once, as
always. The in-memory log and ledger, and a follower that appends, folds and hands over as a
leader does, on the partitions it carries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tests import builders as b
from toolledger.events.codec import encode
from toolledger.events.fold import DeadLetter, Folded, LedgerFold, Positioned
from toolledger.events.log import partition_for
from toolledger.events.memory import MemoryBroker, MemoryLog
from toolledger.events.models import CallReserved
from toolledger.projections.following import PartitionFollower, Proven
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.ownership import MemoryPartitionLocks
from toolledger.projections.projector import Projector

PARTITIONS = 2


class _Lingering(PartitionFollower):
    """Carries `partitions` as a leader does: appends their records itself, folds them and
    hands them over; folds the foreign records the projector fetched before each commit;
    remembers each commit's end offset."""

    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions
        self.fold = LedgerFold(keys=b.KEYS, with_history=False)
        self.folded_to: dict[int, int] = {}
        self.handed: dict[int, list[Proven]] = {}
        self.commits: list[tuple[int, int]] = []
        self.wake: Callable[[int], None] | None = None

    async def took(self, partition: int, next_offset: int) -> None:
        self.folded_to[partition] = next_offset

    async def folding(
        self,
        partition: int,
        items: Sequence[Positioned | DeadLetter],
        next_offset: int,
        halted: bool,
    ) -> list[Folded]:
        fresh = [i for i in items if i.offset >= self.folded_to.get(partition, 0)]
        self.folded_to[partition] = max(self.folded_to.get(partition, 0), next_offset)
        return [self.fold.folded(item) for item in fresh]

    def committed(self, partition: int, next_offset: int) -> None:
        self.commits.append((partition, next_offset))

    def released(self, partition: int) -> None:
        pass

    def attach(self, wake: Callable[[int], None]) -> None:
        self.wake = wake

    def carries(self, partition: int) -> bool:
        return partition in self.partitions

    def covered(self, partition: int) -> int | None:
        return self.folded_to.get(partition)

    def proven(self, partition: int, start: int) -> list[Proven] | None:
        handed = [p for p in self.handed.pop(partition, []) if p.offset >= start]
        return handed

    async def append(self, events: MemoryLog, event: CallReserved) -> None:
        """Append `event` as a leader does (no hint), fold it and hand it over."""
        position = await events.append(event.run_id, encode(event), hint=False)
        item = Positioned(position.partition, position.offset, event)
        assert position.offset == self.folded_to[position.partition]
        self.folded_to[position.partition] = position.offset + 1
        proven = Proven(self.fold.folded(item), own=True)
        self.handed.setdefault(position.partition, []).append(proven)
        assert self.wake is not None
        self.wake(position.partition)


def _runs_in(partition: int, count: int) -> list[str]:
    runs = (f"linger-{n}" for n in range(10_000))
    return [r for r in runs if partition_for(r, PARTITIONS) == partition][:count]


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class _Setup:
    def __init__(self, *, linger_ms: int, batch_size: int = 2000) -> None:
        self.broker = MemoryBroker()
        self.events = self.broker.log("toolledger.events")
        self.store = MemoryLedger(verify_keys=b.KEYS)
        self.follower = _Lingering({0})
        self.projector = Projector(
            self.events,
            self.store,
            MemoryPartitionLocks(),
            fetch_wait_ms=5,
            batch_size=batch_size,
            follower=self.follower,
            linger_ms=linger_ms,
        )
        self.running: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.events.ensure_topic(PARTITIONS)
        await self.store.start()
        self.running = asyncio.create_task(self.projector.run())
        await _until(lambda: len(self.projector.owned) == PARTITIONS, "ownership")

    async def append(
        self, partition: int, count: int, *, foreign: bool = False, call: str = "c1"
    ) -> list[CallReserved]:
        """Records of the follower's own on a partition it carries, else a foreign writer's
        (hinted with its offset, as a writer on the direct path or the API hints)."""
        events = [b.reserved(run, call) for run in _runs_in(partition, count)]
        for event in events:
            if foreign or not self.follower.carries(partition):
                position = await self.events.append(event.run_id, encode(event))
                self.projector.wake({position.partition: position.offset + 1})
            else:
                await self.follower.append(self.events, event)
        return events

    async def stop(self) -> None:
        self.projector.stop()
        assert self.running is not None
        await self.running


async def test_records_of_a_lingering_partition_commit_together_and_others_at_once() -> None:
    setup = _Setup(linger_ms=60_000, batch_size=4)  # only the batch size or a stop commits
    await setup.start()
    try:
        await setup.append(0, 3)
        await _until(lambda: setup.projector.held == {0: 3}, "three records held")
        other = await setup.append(1, 1)
        await _until(lambda: setup.projector.stats.applied == 1, "the other partition's record")
        assert (await setup.store.verdicts([other[0].event_id])).keys() == {other[0].event_id}
        assert setup.follower.commits == [(1, 2)]  # offset 0 is the epoch marker
        assert setup.projector.held == {0: 3}

        await setup.append(0, 1)  # the fourth fills the batch
        await _until(lambda: setup.projector.stats.applied == 5, "the held batch")
        assert setup.follower.commits == [(1, 2), (0, 5)]  # one commit for the four
        assert setup.projector.held == {}
    finally:
        await setup.stop()


async def test_held_records_commit_once_the_oldest_waited_the_linger() -> None:
    setup = _Setup(linger_ms=30)
    await setup.start()
    try:
        reserved = await setup.append(0, 2)
        await _until(lambda: setup.projector.stats.applied == 2, "the linger to end")
        verdicts = await setup.store.verdicts([r.event_id for r in reserved])
        assert all(v.accepted for v in verdicts.values()) and len(verdicts) == 2
        assert setup.projector.held == {}
    finally:
        await setup.stop()


async def test_a_stopping_projector_commits_what_it_holds() -> None:
    setup = _Setup(linger_ms=60_000)
    await setup.start()
    reserved = await setup.append(0, 2)
    await _until(lambda: setup.projector.held == {0: 2}, "two records held")
    await setup.stop()
    assert setup.follower.commits == [(0, 3)]
    assert (await setup.store.partition_state(0)) is not None
    verdicts = await setup.store.verdicts([r.event_id for r in reserved])
    assert len(verdicts) == 2


async def test_a_foreign_record_commits_at_once_with_what_is_held_before_it() -> None:
    """A record the follower did not answer (the API's, a direct-path runtime's) has a writer
    awaiting its committed verdict: it does not wait, and neither do the records before it."""
    setup = _Setup(linger_ms=60_000)
    await setup.start()
    try:
        await setup.append(0, 2)
        await _until(lambda: setup.projector.held == {0: 2}, "two records held")
        await setup.append(0, 1, foreign=True, call="c2")
        await _until(lambda: setup.projector.stats.applied == 3, "the foreign record's commit")
        assert setup.follower.commits == [(0, 4)]  # one commit, in offset order
        assert setup.projector.held == {}
    finally:
        await setup.stop()


async def test_without_linger_every_fetch_commits_at_once() -> None:
    setup = _Setup(linger_ms=0)
    await setup.start()
    try:
        await setup.append(0, 1)
        await _until(lambda: setup.projector.stats.applied == 1, "the record")
        assert setup.projector.held == {}
    finally:
        await setup.stop()
