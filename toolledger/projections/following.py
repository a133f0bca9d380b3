"""PartitionFollower: what a projector tells whoever answers from memory for its partitions.

The leader fast path (`toolledger.leader`) answers runtimes from a fold it keeps in memory,
and that fold is only usable while it agrees with the projection this process commits: the
leader must know when a partition is taken and at which offset (`took`), which records the
projector is about to commit (`folding`, so memory is never behind PostgreSQL), when they
committed (`committed`), and when the partition is gone (`released`): every follower implements
these four. Five more have defaults that change nothing: whether fetched records may linger
before they commit (`lingers`), and the records handed over instead of fetched (`attach`,
`carries`, `proven`, `decoder`, below). The projector calls these nine and knows nothing else
about leaders; without a follower it runs exactly as before.

The leader also hands the projector the records it appended and proved (`proven`), so the
projector need not fetch back what this very process just wrote: while a follower `carries` a
partition the projector parks it in its reader (`LogReader.park`), and fetches it only when a
hint says someone else appended there, once a second in case a hint was lost, and whenever the
handed records do not join up with its position. The records are the log's own (their offsets
are the broker's acknowledgements), so taking them is the same as fetching them.

A follower must not fail the projector: `folding` may take its time (it is awaited before the
batch's transaction), but anything it cannot do it handles itself, by no longer answering for
that partition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from toolledger.events.fold import DeadLetter, Positioned
from toolledger.events.log import LogRecord
from toolledger.events.models import Event

Decode = Callable[[bytes], Event]


class PartitionFollower(ABC):
    """Hears of a projector's ownership and commits, partition by partition."""

    @abstractmethod
    async def took(self, partition: int, next_offset: int) -> None:
        """This process projects `partition` from `next_offset` (taken, or re-read after an
        error): whatever was remembered of it before is void."""

    @abstractmethod
    async def folding(
        self,
        partition: int,
        items: Sequence[Positioned | DeadLetter],
        next_offset: int,
        halted: bool,
    ) -> None:
        """The projector is about to commit `items`, up to `next_offset` (`halted`: and stops
        there, at a record it cannot judge)."""

    @abstractmethod
    def committed(self, partition: int, next_offset: int) -> None:
        """The batch committed: the stored next offset is `next_offset`, moved by this process."""

    @abstractmethod
    def released(self, partition: int) -> None:
        """This process no longer projects `partition` (dropped, conflict, lost a service)."""

    def lingers(self, partition: int, records: Sequence[LogRecord]) -> bool:
        """Whether `partition`'s fetched `records` may wait a little to commit with the ones
        after them (`Projector.linger`): the follower answered them from memory, so nobody
        waits for their commit. No, by default."""
        return False

    def attach(self, wake: Callable[[int], None]) -> None:  # noqa: B027 (optional)
        """`wake(partition)` is to be called when `proven` has more records for `partition`."""

    def carries(self, partition: int) -> bool:
        """Whether `partition`'s records reach the projector through `proven` for now, so its
        reader need not fetch them. No, by default."""
        return False

    def proven(self, partition: int, start: int) -> list[LogRecord] | None:
        """`partition`'s records from offset `start` on that the follower holds, without holes
        (taken: each is handed over once); None when it knows of records from `start` on that
        it does not hold, which the projector must fetch. None, by default."""
        return None

    def decoder(self, partition: int, decode: Decode) -> Decode:
        """How the projector decodes `partition`'s next fetched records: `decode`, unless the
        follower already holds the events some of those bytes decode to."""
        return decode
