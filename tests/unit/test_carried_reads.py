"""Which partitions a projector parks while its leader carries them, and when it tails one.

A partition a leader carries is parked: its records come from the leader, and a foreign
record is fetched on its hint alone. Runtimes on the direct path writing to such a partition
(a leader that timed out, a mixed deployment) made one park, hint, fetch and park cycle per
record, and their steps took 8-99 ms against 6 ms where no leader carried the partition: a
partition hinted twice in quick succession must be tailed until its writers go quiet.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolledger.events.fold import DeadLetter, Folded, Positioned
from toolledger.projections.carried import BUSY_GAP_S, TAIL_S, CarriedReads
from toolledger.projections.following import PartitionFollower


class Carrying(PartitionFollower):
    """A follower that carries every partition and is told nothing else here."""

    async def took(self, partition: int, next_offset: int) -> None:
        pass

    async def folding(
        self,
        partition: int,
        items: Sequence[Positioned | DeadLetter],
        next_offset: int,
        halted: bool,
    ) -> list[Folded]:
        return []

    def committed(self, partition: int, next_offset: int) -> None:
        pass

    def released(self, partition: int) -> None:
        pass

    def carries(self, partition: int) -> bool:
        return True


def reads() -> tuple[CarriedReads, list[float]]:
    now = [100.0]
    return CarriedReads(Carrying(), 0.5, clock=lambda: now[0]), now


def test_a_carried_partition_is_parked_and_one_hint_fetches_it_as_far_as_it_says() -> None:
    carried, now = reads()
    carried.parked = carried.choose({0: 5, 1: 7}, halted=())
    assert carried.parked == {0, 1}
    assert carried.hinted({0: 6})
    assert carried.choose({0: 5, 1: 7}, halted=()) == {1}, "fetched up to the hint's end"
    now[0] += 0.01
    assert carried.choose({0: 6, 1: 7}, halted=()) == {0, 1}, "parked again once there"
    assert carried.tailed == {}


def test_a_partition_hinted_twice_in_quick_succession_is_tailed_until_its_writers_go_quiet() -> (
    None
):
    carried, now = reads()
    carried.parked = carried.choose({0: 5, 1: 7}, halted=())
    carried.hinted({0: 6})
    now[0] += BUSY_GAP_S / 2
    carried.hinted({0: 7})
    assert carried.choose({0: 7, 1: 7}, halted=()) == {1}, "tailed though nothing is wanted"
    now[0] += TAIL_S / 2
    assert carried.choose({0: 7, 1: 7}, halted=()) == {1}
    now[0] += TAIL_S
    assert carried.choose({0: 7, 1: 7}, halted=()) == {0, 1}, "parked once quiet"


def test_hints_further_apart_than_the_busy_gap_tail_nothing() -> None:
    carried, now = reads()
    carried.parked = carried.choose({0: 5}, halted=())
    for end in (6, 7, 8):
        carried.hinted({0: end})
        now[0] += BUSY_GAP_S * 2
    assert carried.tailed == {}
    assert carried.choose({0: 8}, halted=()) == {0}
