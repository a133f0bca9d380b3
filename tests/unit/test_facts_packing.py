"""Packed facts records: several facts per record, per-run order kept, old records still read.

The projector packs a batch's facts into records per facts partition (`FactsPublisher`);
`facts_in`, `toolledger.subscribe` and the processors must hand consumers facts, never packs,
and must keep reading the one-fact records written before packing.
"""

from __future__ import annotations

import json

import pytest

from tests import builders as b
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.log import partition_for
from toolledger.events.memory import MemoryBroker, MemoryLog
from toolledger.projections.facts import Fact, FactsPublisher, FactText, facts_in, facts_of, packs
from toolledger.subscribe import subscribe


def _decided(runs: int, calls: int) -> tuple[LedgerFold, list[FactText]]:
    """A fold of `runs` runs reserving and completing `calls` calls each, interleaved, and the
    facts the projector would publish for it (one batch of partition 0)."""
    fold = LedgerFold()
    offset = 0
    for c in range(calls):
        for r in range(runs):
            reservation = b.reserved(f"run{r}", f"c{c}", arguments={"note": "café ✓"})
            for event in (reservation, b.completed(reservation)):
                offset += 1
                fold.apply(Positioned(0, offset, event))
    verdicts = list(fold.verdicts.values())
    return fold, facts_of(fold.history, verdicts, [v.model_dump_json() for v in verdicts])


async def _facts_log(partitions: int = 3) -> MemoryLog:
    log = MemoryBroker().log("toolledger.ledger")
    await log.create_topic(partitions)
    return log


async def _records(log: MemoryLog) -> list[tuple[int, bytes, bytes]]:
    """Every record of the topic as (partition, key, value), in partition then offset order."""
    reader = log.reader()
    await reader.assign(dict.fromkeys(range(await log.partition_count()), 0))
    fetched = await reader.fetch(0.01)
    await reader.close()
    return [(p, r.key or b"", r.value) for p in sorted(fetched) for r in fetched[p] if r.value]


def test_a_pasted_fact_reads_back_as_the_fact_pydantic_would_have_written() -> None:
    """Facts built by pasting the stored JSON must parse to exactly the old `Fact` (non-ASCII
    text in the event included), or consumers would see different verdicts than the ledger."""
    fold, texts = _decided(runs=2, calls=2)
    for entry, text in zip(fold.history, texts, strict=True):
        old = Fact(
            partition=entry.partition,
            offset=entry.offset,
            verdict=fold.verdicts[entry.event_id],
            event_json=entry.event_json,
        )
        assert Fact.model_validate_json(text.json) == old
        assert json.loads(text.json) == json.loads(old.model_dump_json())


def test_packs_keep_order_and_size_and_a_large_fact_travels_alone() -> None:
    facts = [FactText("r", "x" * n) for n in (10, 10, 10, 50, 10)]
    got = list(packs(facts, limit=25))
    assert [[len(f.json) for f in pack] for pack in got] == [[10, 10], [10], [50], [10]]
    assert [f for pack in got for f in pack] == facts


async def test_published_facts_land_in_their_runs_partition_in_log_order() -> None:
    """Each record must sit in the partition its runs hash to, so a run's facts stay in one
    partition, in log order, however they are packed."""
    _, texts = _decided(runs=12, calls=5)
    log = await _facts_log()
    await FactsPublisher(log, pack_bytes=20_000).publish(texts)
    records = await _records(log)
    assert len(records) < len(texts) // 4  # packed: many facts per record
    order: dict[str, list[int]] = {}
    for partition, key, value in records:
        assert partition_for(key.decode(), 3) == partition
        for fact in facts_in(value):
            assert partition_for(fact.verdict.run_id, 3) == partition
            order.setdefault(fact.verdict.run_id, []).append(fact.offset)
    assert sum(map(len, order.values())) == len(texts)
    for run_id, offsets in order.items():
        assert offsets == sorted(offsets), run_id


def test_an_old_single_fact_record_is_still_read_and_garbage_is_refused() -> None:
    _, texts = _decided(runs=1, calls=1)
    single = Fact.model_validate_json(texts[0].json)
    assert facts_in(single.model_dump_json().encode()) == [single]
    with pytest.raises(ValueError, match="Invalid JSON"):
        facts_in(b"\x00garbage")
    with pytest.raises(ValueError, match="verdict"):
        facts_in(b'[{"partition": 0}]')


async def test_subscribe_yields_facts_of_packed_and_old_records_once_each() -> None:
    """A topic written before and after packing (and a repeat, at least once) must read as
    each fact once, in log order per run."""
    fold, texts = _decided(runs=4, calls=3)
    log = await _facts_log(partitions=1)
    old = [Fact.model_validate_json(t.json) for t in texts[:5]]
    for fact in old:
        await log.append(fact.verdict.run_id, fact.model_dump_json().encode())
    publisher = FactsPublisher(log, pack_bytes=5_000)
    await publisher.publish(texts[5:])
    await publisher.publish(texts[3:9])  # republished after a takeover
    got = [f async for f in subscribe(log, follow=False, idle_timeout=0.05)]
    assert [f.verdict.event_id for f in got] == [v.event_id for v in fold.verdicts.values()]
