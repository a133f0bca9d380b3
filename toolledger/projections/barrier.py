"""The read barrier: a read of the ledger sees every write acknowledged before it was asked.

A partition leader answers a runtime before the projection holds the answer, and a runtime's
outcome returns on Kafka's acknowledgement, so a read of PostgreSQL (the operator API, the
console, the CLI, `testing.Operator`, the processors) could miss a call its runtime was already
told about: an operator would get "not found" for a call that completed a moment ago, or act on
the version before it. The log says what "acknowledged" means: every acknowledged write has an
offset below its partition's end. So a read first learns the end offset of each partition it
covers and waits until the projection has committed that far (the barrier of any log-backed
store, Raft's ReadIndex). Where it covers:

- a key's read covers its run's partition (`partition_for(run_id)`); a key's run_id is the part
  before a `:`, and since a run_id may hold a `:` too, every such prefix is covered;
- a list bounded to a run covers that run's partition, and any other list (the queue, a
  tenant's counts, paused runs) covers every partition.

End offsets come from `Ends` (the log's `EventLog.end_offsets`, which a leader's read index may
raise: `toolledger.leader`), committed positions from `Committed` (the `projection_offsets` rows,
or the memory store's). One look serves concurrent readers (`toolledger.projections.rounds`): a
look asked while one is in flight waits for the next round, which asks for every partition its
readers cover, and never takes a look that started before it was asked (whose end could
predate a write acknowledged to the reader).
The look reads ends and positions at once; a read whose partitions are committed to their ends
(the usual case) goes on after that one round trip. Otherwise it waits in one watch shared by
every waiting reader: the positions are read again on a hint (`hint`: a verdict notification, an
in-process commit) or every `poll` seconds, never in a tight loop.

The wait is bounded (`TOOLLEDGER_READ_BARRIER_TIMEOUT_S`): past it the read raises `StaleRead`,
naming the partitions and how far behind they are, rather than return what might be old. A
reader still waiting after `HALT_CHECK_S` asks once whether a partition it waits for is halted
(`Committed.halts`, recorded by its owner): a halted partition goes no further until someone
deploys, so the read fails at once, saying why, instead of holding a console page or an API
client for the whole bound. This
is for freshness only: the projection's correctness never depends on end offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from toolledger.errors import LedgerUnavailable, seconds
from toolledger.events.log import LogError, partition_for
from toolledger.projections.rounds import Rounds

log = logging.getLogger("toolledger.barrier")

#: Seconds between reads of the committed positions while a reader waits and no hint came.
POLL_S = 0.005
#: Seconds a reader waits before asking whether a partition it waits for is halted.
HALT_CHECK_S = 0.25
#: A partition with no `projection_offsets` row has committed nothing: its offset 0 is the
#: epoch marker, which is never folded, so 1 is where its projection starts.
UNBOUND = 1


class StaleRead(LedgerUnavailable):
    """The ledger could not be shown fresh within the read barrier's bound; nothing was read."""

    code = "stale_read"


class Ends(Protocol):
    """Where each partition of the events topic ends (`EventLog` is one)."""

    async def partition_count(self) -> int: ...

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]: ...


class Committed(Protocol):
    """How far the projection has committed each partition (`PointReads` is one)."""

    async def committed(self, partitions: Collection[int]) -> dict[int, int]: ...

    async def halts(self, partitions: Collection[int]) -> dict[int, str]: ...


@dataclass(frozen=True)
class Look:
    """What a reader learned: each partition's end and committed position, and the deadline
    (monotonic seconds) of its wait."""

    ends: dict[int, int]
    committed: dict[int, int]
    deadline: float

    def behind(self) -> dict[int, int]:
        """The ends of the partitions whose projection has not committed that far."""
        return {p: e for p, e in self.ends.items() if e > self.committed.get(p, UNBOUND)}


_Ends = tuple[dict[int, int], dict[int, int]]


@dataclass
class _Wait:
    targets: dict[int, int]
    reached: asyncio.Future[None]
    seen: dict[int, int] = field(default_factory=dict)


class ReadBarrier:
    """Waits, before a read, until the projection holds every write acknowledged so far."""

    def __init__(
        self, ends: Ends, committed: Committed, *, timeout: float, poll: float = POLL_S
    ) -> None:
        self.ends = ends
        self.committed = committed
        self.timeout = timeout
        self.poll = poll
        self._count: int | None = None
        self._looks: Rounds[int, _Ends] = Rounds(self._read, "toolledger-barrier-look")
        self._waiting: list[_Wait] = []
        self._hinted = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        #: Looks sent (one serves every reader of its round), and reads that had to wait.
        self.looks = 0
        self.waited = 0

    def hint(self) -> None:
        """Something may have committed: a waiting reader looks at once."""
        if self._waiting:
            self._hinted.set()

    async def partitions_of(self, run_ids: Collection[str] | None) -> frozenset[int]:
        """The partitions a read of those runs covers (None: every partition)."""
        if self._count is None:
            self._count = await self.ends.partition_count()
        if run_ids is None:
            return frozenset(range(self._count))
        return frozenset(partition_for(run_id, self._count) for run_id in run_ids)

    async def wait(self, run_ids: Collection[str] | None = None) -> None:
        """Return once the projection committed every write acknowledged before this call in
        the partitions of `run_ids` (None: all); `StaleRead` past the bound."""
        await self.reach(await self.look(run_ids))

    async def look(self, run_ids: Collection[str] | None = None) -> Look:
        """Where the partitions of `run_ids` (None: all) end, and where the projection has
        committed them, as learned after this call; `StaleRead` if the log cannot say."""
        deadline = time.monotonic() + self.timeout
        try:
            partitions = await self.partitions_of(run_ids)
            ends, committed = await self._looks.ask(partitions)
        except LogError as exc:
            raise StaleRead(
                f"cannot learn where the log ends ({exc}); nothing was read, since a read that "
                "cannot be shown fresh is not shown. Try again once Kafka answers."
            ) from exc
        return Look({p: ends.get(p, UNBOUND) for p in partitions}, committed, deadline)

    async def reach(self, look: Look) -> None:
        """Return once the projection committed the partitions of `look` to their ends, within
        the bound counted from the look; `StaleRead` past it."""
        behind = look.behind()
        if behind:
            self.waited += 1
            reached = asyncio.get_running_loop().create_future()
            await self._reach(_Wait(behind, reached, look.committed), look.deadline)

    # -- one look per round --------------------------------------------------------------------

    async def _read(self, partitions: frozenset[int]) -> _Ends:
        self.looks += 1
        ends, committed = await asyncio.gather(
            self.ends.end_offsets(partitions), self.committed.committed(partitions)
        )
        return ends, committed

    # -- waiting for the projection -------------------------------------------------------------

    async def _reach(self, wait: _Wait, deadline: float) -> None:
        self._waiting.append(wait)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(
                self._watching(), name="toolledger-barrier-watch"
            )
        try:
            first = min(deadline, time.monotonic() + HALT_CHECK_S)
            try:
                async with asyncio.timeout(max(first - time.monotonic(), 0.0)):
                    await asyncio.shield(wait.reached)
                return
            except TimeoutError:
                pass
            await self._not_halted(wait)
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await asyncio.shield(wait.reached)
        except TimeoutError:
            raise StaleRead(self._stale(wait)) from None
        finally:
            if wait in self._waiting:
                self._waiting.remove(wait)

    async def _watching(self) -> None:
        while self._waiting:
            try:
                async with asyncio.timeout(self.poll):
                    await self._hinted.wait()
            except TimeoutError:
                pass
            self._hinted.clear()
            waiting = list(self._waiting)
            if not waiting:
                return
            partitions = frozenset().union(*(w.targets for w in waiting))
            try:
                committed = await self.committed.committed(partitions)
            except Exception as exc:  # every waiter fails as its own read of PostgreSQL would
                for w in waiting:
                    if not w.reached.done():
                        w.reached.set_exception(exc)
                        w.reached.exception()  # retrieved: a reader that gave up reads no more
                continue
            for w in waiting:
                w.seen = committed
                reached = all(committed.get(p, UNBOUND) >= end for p, end in w.targets.items())
                if reached and not w.reached.done():
                    w.reached.set_result(None)

    async def _not_halted(self, wait: _Wait) -> None:
        """`StaleRead` now if a partition `wait` needs is halted where it stands."""
        behind = [p for p, end in wait.targets.items() if wait.seen.get(p, UNBOUND) < end]
        try:
            halts = await self.committed.halts(behind)
        except Exception as exc:  # the wait goes on: its bound still holds
            log.debug("cannot read the halts of %s (%s)", behind, exc)
            return
        if halts and not wait.reached.done():
            why = "; ".join(f"partition {p} is halted: {halts[p]}" for p in sorted(halts))
            raise StaleRead(
                f"the ledger cannot be shown fresh: {why}. Nothing was read, so nothing old "
                "was shown; the read succeeds again once the partition's projector goes on "
                "(toolledger status)."
            )

    def _stale(self, wait: _Wait) -> str:
        behind = [
            f"partition {p} is committed to offset {at}, the log ends at {end} "
            f"({end - at} record{'s' if end - at != 1 else ''} behind)"
            for p, end in sorted(wait.targets.items())
            if (at := wait.seen.get(p, UNBOUND)) < end
        ]
        return (
            f"the ledger in PostgreSQL did not catch up with the log within "
            f"{seconds(self.timeout)}: {'; '.join(behind) or 'it caught up only just now'}. "
            "Nothing was read, so nothing old was shown. Is a `toolledger projector` running "
            "and keeping up with this ledger? Try again, or raise "
            "TOOLLEDGER_READ_BARRIER_TIMEOUT_S."
        )

    async def close(self) -> None:
        """Stop the background look and watch; readers still waiting fail `StaleRead`."""
        self._looks.cancel()
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
        for w in self._waiting:
            if not w.reached.done():
                w.reached.set_exception(StaleRead("the ledger client was closed; nothing read"))
                w.reached.exception()
