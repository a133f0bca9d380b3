"""Rounds: concurrent reads coalesced into one read per round, never answered by an older one.

Two readers need the same move. The runtime's point reads of call records (`CallReads`): with
many runs in flight, each read costs a round trip, a statement and a connection's turn. The read
barrier's look at where partitions end (`toolledger.projections.barrier`): every reader of the
API or console asks for the same few partitions. Both coalesce: a read asked while none is under
way runs at once, in the caller's task; reads asked meanwhile wait for the next round, which one
task runs for all of them, over the union of what they asked.

A round starts after every read it answers was asked, so a read is never answered by a read
that left before it was asked: for the barrier that is the point (an end learned before a write
was acknowledged to its reader would not cover it), and a record read so is no older than a
query of its own would have been. A failed round fails every read it answered (each caller then
fails as its own read would have); a cancelled caller leaves the round to the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


class Rounds(Generic[K, R]):
    """`read(keys)` for concurrent askers, one call per round (see the module)."""

    def __init__(self, read: Callable[[frozenset[K]], Awaitable[R]], name: str) -> None:
        self._read = read
        self._name = name
        self._asked: list[tuple[frozenset[K], asyncio.Future[R]]] = []
        self._busy = False
        self._round: asyncio.Task[None] | None = None

    async def ask(self, keys: Collection[K]) -> R:
        """What `read` answered for a round that included `keys` and started after this call;
        the round's error if it failed."""
        if self._busy:
            fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            self._asked.append((frozenset(keys), fut))
            return await fut
        self._busy = True
        try:
            return await self._read(frozenset(keys))
        finally:
            self._busy = False
            if self._asked:
                self._busy = True
                self._round = asyncio.get_running_loop().create_task(
                    self._rounds(), name=self._name
                )

    async def _rounds(self) -> None:
        asked: list[tuple[frozenset[K], asyncio.Future[R]]] = []
        try:
            while self._asked:
                asked, self._asked = self._asked, []
                try:
                    found = await self._read(frozenset().union(*(keys for keys, _ in asked)))
                except Exception as exc:  # every reader gets the error its own read would have
                    for _, fut in asked:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for _, fut in asked:
                    if not fut.done():
                        fut.set_result(found)
        except asyncio.CancelledError:
            for _, fut in (*asked, *self._asked):
                fut.cancel()
            self._asked.clear()
            raise
        finally:
            self._busy = False
            self._round = None

    def cancel(self) -> None:
        """Stop the round under way, if a task runs one (its readers are cancelled)."""
        if self._round is not None and not self._round.done():
            self._round.cancel()
