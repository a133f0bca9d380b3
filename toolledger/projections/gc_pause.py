"""Cyclic garbage collection held off while a batch is decoded and folded.

Decoding and folding a batch allocates tens of thousands of small container objects (events,
records, verdicts, history entries) that CPython's collector counts: every 700 allocations it
scans the young generation, and every few of those it walks older ones too. Nearly none of it
is cyclic garbage, so reference counting frees it and the scans find nothing; measured on the
projector's own decode and fold, they were a third of its CPU (77 -> 49 us per event).

`gc_paused()` therefore disables automatic collection for the length of a batch and restores it
afterwards, so the collector runs between batches, while the projector waits on I/O; a ledger
snapshot (replay's digest) is paused the same way. It is process-wide, so it only ever covers
one bounded piece of work (memory held by cycles made meanwhile is freed at the next
collection), and it leaves alone a collector someone else disabled.

`SurvivorFreezer` keeps a leader's large, long-lived memory out of the full collections.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block (if it was on when the block began)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SurvivorFreezer:
    """Freeze what outlives a full collection, so later full collections walk only newer objects.

    A projector that leads partitions keeps their folds in memory (`toolledger.leader`): up to
    `MEMORY_CAP` calls, runs and verdicts, hundreds of thousands of objects, none of them
    garbage. CPython walks every tracked object at each full collection, which comes whenever
    the old generation grew by a quarter: on the 64-way benchmark that was four collections of
    about 250 ms each in 11 s of the projector's CPU, every answer waiting behind each of them.

    Installed, it moves everything alive at the end of each full collection into the permanent
    generation (`gc.freeze`). That moment is the one where the heap holds nothing the collector
    could free, so the frozen objects are all live; those that die later are still freed by
    reference counting. Only cycles among frozen objects that become garbage later would stay,
    so every `thaw_every` seconds the permanent generation goes back to the old one
    (`gc.unfreeze`) at the end of a full collection, and the next full one walks the whole heap
    once, frees those cycles and freezes again. Freezing and thawing run in the collector's own
    "stop" callback, after the collection and before anything else allocates. Process-wide, so
    only a command that owns its process installs it (`toolledger projector`, `toolledger
    serve`), as with `gc.freeze` at start-up.
    """

    def __init__(self, thaw_every: float = 600.0) -> None:
        self.thaw_every = thaw_every
        self.freezes = 0
        self.thaws = 0
        self._thawed_at = time.monotonic()

    def install(self) -> None:
        if self._collected not in gc.callbacks:
            gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        now = time.monotonic()
        if now - self._thawed_at >= self.thaw_every:
            self._thawed_at = now
            self.thaws += 1
            gc.unfreeze()
        else:
            self.freezes += 1
            gc.freeze()


#: Allocations (net of frees) between young collections in a process that owns a projector;
#: CPython's default is 700. Each young collection walks what survived since the last one and
#: promotes it, and a leader answering many calls allocates steadily (frames, events, verdicts),
#: so at 700 the collector ran after nearly every batch. A 64-way probe (not committed, four
#: alternated pairs) spent 1,040-1,164 us of projector CPU per step with the default and
#: 1,016-1,079 us with this, less in every pair (BENCHMARKS.md, sixteenth session).
YOUNG_THRESHOLD = 20_000


def settle_collector() -> SurvivorFreezer:
    """Set up the collector for a long-lived process that owns a projector (`toolledger
    projector`, `toolledger serve`), once everything it starts with is loaded: freeze that
    (it lives as long as the process), collect young objects less often (`YOUNG_THRESHOLD`),
    and freeze what outlives each full collection (`SurvivorFreezer`). Process-wide: a library
    cannot decide this for its host; these commands own their process."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    freezer = SurvivorFreezer()
    freezer.install()
    return freezer
