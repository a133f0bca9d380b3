"""`SurvivorFreezer`: what outlives a full collection is frozen, and garbage still goes.

A leader's memory (hundreds of thousands of live objects) must stay out of the full
collections, which otherwise walk all of it; garbage must still be freed: acyclic garbage
always, by reference counting, cycles made after a freeze at the next collection, and cycles
among frozen objects once a thaw brings them back into view.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from toolledger.projections.gc_pause import YOUNG_THRESHOLD, SurvivorFreezer, settle_collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


@pytest.fixture
def freezer() -> Iterator[SurvivorFreezer]:
    gc.collect()
    gc.unfreeze()
    frozen = SurvivorFreezer()
    frozen.install()
    yield frozen
    frozen.uninstall()
    gc.unfreeze()


def test_what_outlives_a_full_collection_is_frozen(freezer: SurvivorFreezer) -> None:
    live = [Node() for _ in range(1000)]
    gc.collect()
    assert freezer.freezes == 1
    assert gc.get_freeze_count() >= len(live)
    gc.collect(0)  # a young collection freezes nothing
    assert freezer.freezes == 1


def test_garbage_made_after_a_freeze_is_still_collected(freezer: SurvivorFreezer) -> None:
    gc.collect()
    node, alive = cycle()
    del node
    assert alive() is not None  # a cycle: reference counting alone cannot free it
    gc.collect()
    assert alive() is None


def test_a_thaw_frees_cycles_that_died_frozen(freezer: SurvivorFreezer) -> None:
    node, alive = cycle()
    gc.collect()  # frozen while alive
    del node
    gc.collect()
    assert alive() is not None  # frozen objects are not walked: this is what a thaw is for
    freezer.thaw_every = 0
    gc.collect()  # ends by thawing
    assert freezer.thaws == 1 and gc.get_freeze_count() == 0
    freezer.thaw_every = 600
    gc.collect()  # walks what was frozen
    assert alive() is None
    assert gc.get_freeze_count() > 0  # and freezes the survivors again


def test_uninstalled_it_freezes_nothing(freezer: SurvivorFreezer) -> None:
    freezer.uninstall()
    gc.collect()
    assert freezer.freezes == 0 and gc.get_freeze_count() == 0


def test_settling_the_collector_freezes_start_up_and_spaces_young_collections() -> None:
    """`settle_collector` (run by `toolledger projector` and `toolledger serve` once started):
    what exists then is frozen, young collections wait for `YOUNG_THRESHOLD` allocations (the
    older generations keep their thresholds), and full collections freeze their survivors."""
    before = gc.get_threshold()
    gc.collect()
    gc.unfreeze()
    start_up = [Node() for _ in range(1000)]
    freezer = settle_collector()
    try:
        assert gc.get_freeze_count() >= len(start_up)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        later = [Node() for _ in range(1000)]
        frozen = gc.get_freeze_count()
        gc.collect()
        assert freezer.freezes == 1 and gc.get_freeze_count() >= frozen + len(later)
    finally:
        freezer.uninstall()
        gc.set_threshold(*before)
        gc.unfreeze()
