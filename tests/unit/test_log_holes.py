"""Holes in a partition's offsets: the reader waits one out, the fold never folds around one.

The local broker (tansu) makes a record readable a few milliseconds after records other
producers appended after it. A projector that read on past it folded a CI drill without one
event (the re-fold of the log then differed from the live ledger at that offset). The reader's
`Contiguous` cuts a fetch at the hole and reads again from it; a hole that outlasts its patience
reaches `decode_records`, which halts the partition before it.
"""

from __future__ import annotations

import logging

import pytest

from tests import builders as b
from toolledger.events.codec import encode
from toolledger.events.kafka import Contiguous
from toolledger.events.log import LogRecord
from toolledger.projections.decoding import decode_records


def _records(*offsets: int, partition: int = 0) -> list[LogRecord]:
    out = []
    for offset in offsets:
        event = b.reserved(f"r{offset}", "c1")
        out.append(LogRecord(partition, offset, event.run_id.encode(), encode(event), 0))
    return out


def _offsets(records: list[LogRecord]) -> list[int]:
    return [r.offset for r in records]


def test_a_fetch_is_cut_at_a_hole_and_read_again_from_it() -> None:
    reader = Contiguous(patience=5.0)
    reader.start({0: 3})
    kept, again = reader.take(0, _records(3, 4, 6, 7), now=0.0)
    assert (_offsets(kept), again) == ([3, 4], 5)
    # The broker shows 5 on the next fetch from it: everything goes through, in order.
    kept, again = reader.take(0, _records(5, 6, 7), now=0.01)
    assert (_offsets(kept), again) == ([5, 6, 7], None)
    kept, again = reader.take(0, _records(8), now=0.02)
    assert (_offsets(kept), again) == ([8], None)


def test_a_hole_at_the_first_offset_read_hands_out_nothing() -> None:
    reader = Contiguous(patience=5.0)
    reader.start({0: 1, 1: 1})
    kept, again = reader.take(0, _records(2, 3), now=0.0)
    assert (kept, again) == ([], 1)
    kept, again = reader.take(1, _records(1, 2, partition=1), now=0.0)
    assert (_offsets(kept), again) == ([1, 2], None), "partitions are independent"


def test_records_before_the_next_offset_are_not_handed_out_twice() -> None:
    reader = Contiguous(patience=5.0)
    reader.start({0: 5})
    kept, _ = reader.take(0, _records(3, 4, 5, 6), now=0.0)
    assert _offsets(kept) == [5, 6]


def test_a_hole_that_outlasts_the_patience_is_handed_over_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = Contiguous(patience=2.0)
    reader.start({0: 1})
    assert reader.take(0, _records(1, 3), now=10.0)[1] == 2
    assert reader.take(0, _records(3), now=11.0) == ([], 2), "still within its patience"
    with caplog.at_level(logging.WARNING, logger="toolledger.events.kafka"):
        kept, again = reader.take(0, _records(3, 4), now=12.5)
    assert (_offsets(kept), again) == ([3, 4], None)
    assert "partition 0 offset 2 stayed missing for 2s" in caplog.text


def test_the_patience_counts_from_when_that_offset_went_missing() -> None:
    reader = Contiguous(patience=2.0)
    reader.start({0: 1})
    assert reader.take(0, _records(2), now=0.0) == ([], 1)
    assert _offsets(reader.take(0, _records(1, 2), now=1.0)[0]) == [1, 2]
    # A new hole at 3, seen long after the first one opened: it gets its own patience.
    assert reader.take(0, _records(4), now=3.0) == ([], 3)
    assert reader.take(0, _records(4), now=4.5) == ([], 3)


def test_a_new_assignment_starts_over() -> None:
    reader = Contiguous(patience=5.0)
    reader.start({0: 1})
    reader.take(0, _records(1, 2), now=0.0)
    reader.start({0: 10})
    assert _offsets(reader.take(0, _records(10), now=0.1)[0]) == [10]
    kept, again = reader.take(7, _records(4, 9, partition=7), now=0.1)
    assert (_offsets(kept), again) == ([4, 9], None), "an unassigned partition is not judged"


def test_the_fold_halts_before_a_hole_instead_of_folding_around_it() -> None:
    batch = decode_records(1, _records(5, 6, 8, 9, partition=1), 5, b.KEYS)
    assert [item.offset for item in batch.items] == [5, 6]
    assert batch.next_offset == 7
    assert batch.halted is not None
    assert "partition 1 offset 7: the log has no record there but has one at 8" in batch.halted


def test_the_fold_halts_when_the_first_record_is_past_its_start() -> None:
    batch = decode_records(0, _records(4, 5), 3, b.KEYS)
    assert (batch.items, batch.next_offset) == ([], 3)
    assert batch.halted is not None and "offset 3" in batch.halted


def test_a_skip_moves_the_next_offset_on_and_never_back() -> None:
    reader = Contiguous(patience=5.0)
    reader.start({0: 3})
    kept, _ = reader.take(0, _records(3), now=0.0)
    assert _offsets(kept) == [3]
    assert reader.take(0, _records(5), now=0.0)[1] == 4, "a hole at 4 is open"
    assert reader.skip(0, 6), "the caller has 4 and 5 from elsewhere"
    kept, again = reader.take(0, _records(4, 5, 6, 7), now=0.01)
    assert (_offsets(kept), again) == ([6, 7], None)
    assert not reader.skip(0, 2) and not reader.skip(0, 8)
    assert not reader.skip(1, 9), "a partition not read is not skipped"
