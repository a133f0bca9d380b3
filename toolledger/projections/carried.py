"""Partitions a projector's follower carries: what its reader fetches of them, and when.

While a follower carries a partition (a leader appends the runtimes' records there and hands
each over, proven and folded: `PartitionFollower.proven`), fetching the partition would bring
back records this process wrote, at a cost to the broker that is ten times the appends'
(BENCHMARKS.md, issue 46). So the projector parks such a partition in its reader and fetches
only offsets that no batch of this process covers: records someone else appended (the API,
the reconciler, a runtime on the direct path, another leader), and holes in what was handed
over. `CarriedReads` keeps what it knows of them:

- **Wanted ends.** `wanted[p]` is an offset before which partition `p` holds records the
  projector lacks. The reader fetches `p` until the projector's position reaches it, then
  parks it again: a bounded fetch, never a tail. It is learnt from a writer's hint, which
  carries the offset it appended at (`toolledger.projections.hints`), and from a check of
  the partition's end offset.
- **End checks** (`check_ends`), every `check_every` seconds (the readers' idle bound) and at
  once after a hint that names no offset: the end offsets of the parked partitions, one
  request. An end past both the projector's position and what the follower folded
  (`PartitionFollower.covered`) is wanted. While the follower has a batch of its own in
  flight (`covered` is None) the check leaves the partition alone: that batch's proof fetches
  every record before it, and any after it are seen by a later check. Brokers that report an
  end offset short (tansu: a batch's base offset plus one) still report one past the
  projector's position when a record is there, because a foreign batch never begins before
  it; a record a check misses anyway is found by a later one or by the leader's next proof.
- **Holes** (`unjoined`): handed records that do not start at the projector's position (the
  follower dropped some at its cap); the partition is fetched until they join up again.
- **Busy foreign writers** (`tailed`): a partition hinted twice within `BUSY_GAP_S` is tailed,
  not parked, until `TAIL_S` after its last hint. One foreign record at a time (an operator's
  decision, a finding) is fetched on its hint alone; but runtimes on the direct path writing
  to a partition a leader also carries (a leader that timed out, a mixed deployment) made a
  park, hint, fetch, park cycle per record: 406 steps/s against 1,094 on partitions no leader
  carried (`make bench-peers`, the direct row after the leader rows). Tailed, the projector
  fetches back what its own leader appends meanwhile, which costs the broker and the decode
  the follower spares it otherwise, but only while someone else is writing there too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping

from toolledger.events.log import EventLog
from toolledger.projections.following import PartitionFollower

#: Two hints for a partition this close together mean a busy foreign writer: it is tailed.
BUSY_GAP_S = 0.05
#: How long a busy foreign writer's partition is tailed after its last hint.
TAIL_S = 1.0


class CarriedReads:
    """Which carried partitions a projector parks, and up to where it fetches them anyway."""

    def __init__(
        self,
        follower: PartitionFollower,
        check_every: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.follower = follower
        self.check_every = check_every
        self._clock = clock
        #: Per partition, when it was last hinted, and until when it is tailed.
        self._hinted_at: dict[int, float] = {}
        self.tailed: dict[int, float] = {}
        #: Partitions the reader does not fetch now.
        self.parked: frozenset[int] = frozenset()
        #: Per partition, an offset before which it holds records the projector lacks.
        self.wanted: dict[int, int] = {}
        #: Carried partitions whose handed records do not join up with their position.
        self.unjoined: set[int] = set()
        #: Set to have the end offsets checked at once (a hint that named no offset).
        self.check_now = asyncio.Event()
        #: End checks made (each one request for every parked partition).
        self.checks = 0

    def hinted(self, ends: Mapping[int, int | None]) -> bool:
        """Someone appended to these partitions, before the offset given (None: unknown, so
        the ends are checked at once); whether any of them is parked."""
        touched = False
        now = self._clock()
        for partition, end in ends.items():
            last, self._hinted_at[partition] = self._hinted_at.get(partition), now
            if last is not None and now - last < BUSY_GAP_S:
                self.tailed[partition] = now + TAIL_S
            if partition not in self.parked:
                continue
            touched = True
            if end is None:
                self.check_now.set()
            elif end > self.wanted.get(partition, 0):
                self.wanted[partition] = end
        return touched

    def choose(self, positions: Mapping[int, int], halted: Collection[int]) -> frozenset[int]:
        """The partitions (of `positions`: each owned one's next offset) to park now: the
        follower carries them, their handed records join up, no busy foreign writer has them
        tailed, and nothing is wanted past their position. A wanted end the position reached
        is forgotten."""
        wanted = self.wanted
        parked = set()
        now = self._clock()
        for partition, until in list(self.tailed.items()):
            if until <= now:
                del self.tailed[partition]
        for partition, position in positions.items():
            end = wanted.get(partition)
            if end is not None and end <= position:
                del wanted[partition]
                end = None
            if (
                end is None
                and partition not in self.unjoined
                and partition not in halted
                and partition not in self.tailed
                and self.follower.carries(partition)
            ):
                parked.add(partition)
        return frozenset(parked)

    async def check_ends(self, log: EventLog, positions: Mapping[int, int]) -> bool:
        """One end-offset check of the parked partitions (`positions`: the projector's next
        offset of each owned one); whether it found one to fetch."""
        parked = self.parked
        if not parked:
            return False
        self.checks += 1
        ends = await log.end_offsets(sorted(parked))
        found = False
        for partition, end in ends.items():
            covered = self.follower.covered(partition)
            position = positions.get(partition)
            if partition not in self.parked or covered is None or position is None:
                continue
            if end > max(position, covered) and end > self.wanted.get(partition, 0):
                self.wanted[partition] = end
                found = True
        return found
