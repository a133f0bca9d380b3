"""A leader hands its projector the records it appended and proved, folded, instead of the
projector fetching them back and folding them again (`PartitionAppender.take_proven`,
`Projector._take_handed`).

What is handed over must be exactly what the log holds at those offsets, the foreign records
a batch had to fetch before it included, in order and without holes, each with the verdict a
fold of the log reaches and marked as the leader's own or not; and where memory has folded
records it no longer holds, the projector must be told to fetch, not given a hole. These run
the appender on the in-memory log, whose records are read back to compare.
"""

from __future__ import annotations

from tests import builders as b
from toolledger.events.codec import decode, encode
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.log import LogRecord, partition_for
from toolledger.events.memory import MemoryLog
from toolledger.events.models import Event
from toolledger.leader.projector_side.appender import GapReader, PartitionAppender
from toolledger.leader.projector_side.partition import LeaderPartition, Loaded, Needs
from toolledger.leader.runtime_side.frames import Kind
from toolledger.projections.following import Proven

START = 1  # offset 0 holds the epoch marker


async def _nothing_stored(partition: int, needs: Needs, generation: int) -> Loaded:
    """PostgreSQL as a fresh ledger answers: no rows, the stored offset where it started."""
    return Loaded(stored=START, needs=needs, generation=generation)


def _appender(log: MemoryLog) -> tuple[PartitionAppender, list[int]]:
    state = LeaderPartition(0, START, b.KEYS)
    appender = PartitionAppender(state, log, _nothing_stored, GapReader(log, b.KEYS))
    told: list[int] = []
    appender.on_proven = told.append
    return appender, told


async def _log_records(log: MemoryLog, start: int) -> list[LogRecord]:
    reader = log.reader()
    await reader.assign({0: start})
    fetched = await reader.fetch(0.01)
    await reader.close()
    return fetched.get(0, [])


def _same(handed: list[Proven], held: list[LogRecord]) -> bool:
    """Each handed record is the log's (its position, the event its bytes decode to), and
    carries the verdict the reference fold of the log reaches for it."""
    reference = LedgerFold(keys=b.KEYS)
    verdicts = [reference.apply(Positioned(0, r.offset, decode(r.value))) for r in held]
    return [
        (p.folded.item.partition, p.offset, p.folded.item.event, p.folded.verdict)  # type: ignore[union-attr]
        for p in handed
    ] == [(r.partition, r.offset, decode(r.value), v) for r, v in zip(held, verdicts, strict=True)]


async def _submit(appender: PartitionAppender, event: Event) -> Kind:
    answer = await appender.submit(event, encode(event))
    return answer.kind


async def test_proven_records_are_the_logs_own_foreign_ones_included() -> None:
    log = MemoryLog("events", partitions=1)
    appender, told = _appender(log)
    assert partition_for("r1", 1) == 0
    assert await _submit(appender, b.reserved("r1", "c1")) is Kind.VERDICT
    foreign = b.reserved("r2", "c1")
    await log.append(foreign.run_id, encode(foreign))  # another writer's, before the next batch
    assert await _submit(appender, b.reserved("r1", "c2")) is Kind.VERDICT
    assert told and set(told) == {0}
    handed = appender.take_proven(START)
    assert handed is not None
    assert [r.offset for r in handed] == [1, 2, 3]
    assert [r.own for r in handed] == [True, False, True]
    assert _same(handed, await _log_records(log, START))
    assert appender.take_proven(4) == [], "each record is handed over once"


async def test_records_the_projector_has_are_dropped_and_a_hole_is_not_handed_over() -> None:
    log = MemoryLog("events", partitions=1)
    appender, _ = _appender(log)
    for call in ("c1", "c2", "c3"):
        assert await _submit(appender, b.reserved("r1", call)) is Kind.VERDICT
    handed = appender.take_proven(2)  # the projector fetched offset 1 itself
    assert handed is not None and [r.offset for r in handed] == [2, 3]
    assert _same(handed, (await _log_records(log, START))[1:])


async def test_records_memory_folded_but_no_longer_holds_are_the_projectors_to_fetch() -> None:
    log = MemoryLog("events", partitions=1)
    appender, _ = _appender(log)
    assert await _submit(appender, b.reserved("r1", "c1")) is Kind.VERDICT
    assert await _submit(appender, b.reserved("r1", "c2")) is Kind.VERDICT
    del appender.proven[0]  # as when the cap drops them: offset 1 is folded, not held
    assert appender.take_proven(START) is None
    assert appender.take_proven(3) == [], "past what memory folded there is nothing to fetch"
