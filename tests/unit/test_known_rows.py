"""What a projector remembers of a partition's rows (`KnownRows`): a small batch's reads cost what
the batch names, not what the partition remembers.

A projector keeps up to `KNOWN_LIMIT` rows of each partition it owns, and folds each small
batch on them. Working out which of a batch's rows it knows must look up the batch's names in
those rows, never walk them: `wanted - known.keys()` walks the whole key view, which cost a
leader's projector 135 us per small batch at 4,000 remembered calls (BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from tests.builders import reserved
from toolledger.events.fold import Positioned
from toolledger.events.records import CallRecord, RunRecord
from toolledger.projections.known_rows import KnownRows

V = TypeVar("V")


class Unwalked(dict[str, V], Generic[V]):
    """A dict that records whether anyone walked it (iterated it or asked for its keys)."""

    walked = False

    def __iter__(self) -> Iterator[str]:
        type(self).walked = True
        return super().__iter__()

    def keys(self) -> Any:  # dict_keys, which typing cannot name
        type(self).walked = True
        return super().keys()


def _known(rows: int) -> KnownRows:
    """A partition's memory of `rows` calls, runs and histories, all known absent."""
    known = KnownRows(next_offset=10)
    known.calls = Unwalked[CallRecord | None]((f"old{n}:c", None) for n in range(rows))
    known.runs = Unwalked[RunRecord | None]((f"old{n}", None) for n in range(rows))
    known.heads = Unwalked[str | None](
        (name, None) for n in range(rows) for name in (f"old{n}", f"old{n}:c")
    )
    Unwalked.walked = False
    return known


def test_a_small_batch_looks_its_rows_up_without_walking_what_the_partition_remembers() -> None:
    known = _known(5_000)
    items = [
        Positioned(0, 10, reserved("old7", "c")),  # a call and run the partition remembers
        Positioned(0, 11, reserved("new1", "c")),  # one it has never seen
    ]

    reads = known.reads(items)

    assert not Unwalked.walked
    assert reads.assumed.calls == ["new1:c"]
    assert reads.assumed.runs == ["new1"]
    assert reads.assumed.histories == ["new1", "new1:c"]
    assert len(reads.assumed.verdicts) == 2  # neither event was decided before
    assert reads.calls == {} and reads.runs == {}  # remembered as absent: nothing to fold on
