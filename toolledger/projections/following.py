"""PartitionFollower: what a projector tells whoever answers from memory for its partitions.

The leader fast path (`toolledger.leader`) answers runtimes from a fold it keeps in memory,
and that fold is only usable while it agrees with the projection this process commits: the
leader must know when a partition is taken and at which offset (`took`), which records the
projector is about to commit (`folding`, so memory is never behind PostgreSQL), when they
committed (`committed`), and when the partition is gone (`released`): every follower implements
these four. Four more have defaults that change nothing: the records handed over instead of
fetched (`attach`, `carries`, `covered`, `proven`, below). The projector calls these eight and
knows nothing else about leaders; without a follower it runs exactly as before.

The leader also hands the projector the records it appended and proved, with what its fold
decided for each (`proven`, `Proven`), so the projector neither fetches back what this very
process just wrote nor folds it a second time: it writes the leader's verdicts and rows
(`LedgerStore.apply_folded`). The records are the log's own (their offsets are the broker's
acknowledgements, or the fetch's for foreign records the leader fetched to fill a gap), so
taking them is the same as fetching them. While a follower `carries` a partition the projector
parks it in its reader (`LogReader.park`) and fetches only what no batch of this process
covers: up to an offset a writer's hint or the partition's end offset says is there, and
whenever the handed records do not join up with its position. What it fetches it hands to the
follower before committing (`folding`), which folds it once, for both of them.

A follower must not fail the projector: `folding` may take its time (it is awaited before the
batch's transaction), but anything it cannot do it handles itself, by no longer answering for
that partition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import NamedTuple

from toolledger.events.fold import DeadLetter, Folded, Positioned


class Proven(NamedTuple):
    """A record a follower proved and folded, handed to the projector instead of fetched:
    `own` when the follower appended it itself (nobody awaits its commit: it may linger),
    not when it fetched it (a foreign writer's, whose writer awaits the committed verdict)."""

    folded: Folded
    own: bool

    @property
    def offset(self) -> int:
        return self.folded.item.offset


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
    ) -> list[Folded]:
        """The projector is about to commit `items`, up to `next_offset` (`halted`: and stops
        there, at a record it cannot judge). Returns what it folded of them now, in order
        (those it had not folded before; none if it folds nothing), for the projector to
        write instead of folding them again."""

    @abstractmethod
    def committed(self, partition: int, next_offset: int) -> None:
        """The batch committed: the stored next offset is `next_offset`, moved by this process."""

    @abstractmethod
    def released(self, partition: int) -> None:
        """This process no longer projects `partition` (dropped, conflict, lost a service)."""

    def attach(self, wake: Callable[[int], None]) -> None:  # noqa: B027 (optional)
        """`wake(partition)` is to be called when `proven` has more records for `partition`."""

    def carries(self, partition: int) -> bool:
        """Whether `partition`'s records reach the projector through `proven` for now, so its
        reader need not fetch them, and its own records may linger before they commit
        (`Projector.linger`: the follower answered them from memory). No, by default."""
        return False

    def covered(self, partition: int) -> int | None:
        """The offset before which every record of `partition` reaches the projector through
        `proven` (what the follower folded), or None while a batch of its own is in flight,
        whose proof fetches whatever lies before it. None, by default."""
        return None

    def proven(self, partition: int, start: int) -> list[Proven] | None:
        """`partition`'s records from offset `start` on that the follower holds, without holes
        (taken: each is handed over once); None when it knows of records from `start` on that
        it does not hold, which the projector must fetch. None, by default."""
        return None
