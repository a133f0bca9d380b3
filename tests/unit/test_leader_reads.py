"""A leader's reads of keys it does not hold, and how its answers leave.

Reads of keys memory lacks go to PostgreSQL; the reads waiting at one time must share one
statement (64 calls reading their keys used to cost the leader 64 round trips, each holding
the partition's lock), a reader given up on must not take the others' answer with it, and rows
whose provenance fails must stop the partition for every reader. Frames queued in one turn of
the loop must leave together, whole and in order, within that turn.
"""

from __future__ import annotations

import asyncio

import pytest

from tests import builders as b
from toolledger.events.codec import encode
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.lifecycle import new_run
from toolledger.events.memory import MemoryLog
from toolledger.leader.projector_side.appender import GapReader, PartitionAppender
from toolledger.leader.projector_side.partition import (
    LeaderPartition,
    LeaderSuperseded,
    Loaded,
    Needs,
)
from toolledger.leader.runtime_side.frames import FrameWriter, Kind, encode_frame, read_frame

START = 5


class Database:
    """Stands in for `LeaderReads.load`: answers after `gate` opens, counting statements."""

    def __init__(self, stored: int = START) -> None:
        self.stored = stored
        self.statements: list[Needs] = []
        self.gate = asyncio.Event()

    async def load(self, partition: int, needs: Needs, generation: int) -> Loaded:
        self.statements.append(needs)
        await self.gate.wait()
        return Loaded(stored=self.stored, needs=needs, generation=generation)


def _appender(db: Database) -> PartitionAppender:
    log = MemoryLog("toolledger.events", partitions=1)
    state = LeaderPartition(0, START, b.KEYS)
    return PartitionAppender(state, log, db.load, GapReader(log, b.KEYS))


async def test_reads_waiting_together_share_one_statement() -> None:
    """Reads that start while a statement runs go in the next one: 40 reads, two statements,
    and every key and run known afterwards."""
    db = Database()
    appender = _appender(db)
    first = asyncio.create_task(appender.learn_call("r0:c1", "r0"))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(appender.learn_call(f"r{n}:c1", f"r{n}")) for n in range(1, 40)]
    await asyncio.sleep(0)
    db.gate.set()
    await asyncio.gather(first, *rest)
    assert len(db.statements) == 2
    assert db.statements[0].keys == {"r0:c1"}
    assert db.statements[1].keys == {f"r{n}:c1" for n in range(1, 40)}
    assert db.statements[1].runs == {f"r{n}" for n in range(1, 40)}
    assert all(appender.state.knows(f"r{n}:c1") for n in range(40))
    assert all(appender.state.knows_run(f"r{n}") for n in range(40))
    await appender.learn_call("r7:c1", "r7")  # known now: no statement at all
    assert len(db.statements) == 2


async def test_a_reservation_read_with_its_key_is_appended_without_another_statement() -> None:
    """A `RESERVE` asks, with its key and run, whether its event_id was decided before (a
    resend); so its append needs nothing more from PostgreSQL: one statement per new call."""
    db = Database()
    db.gate.set()
    log = MemoryLog("toolledger.events", partitions=1)
    while (await log.append("r0", b"")).offset < START - 1:
        pass  # the records memory starts after: folded (and committed) before
    appender = PartitionAppender(
        LeaderPartition(0, START, b.KEYS), log, db.load, GapReader(log, b.KEYS)
    )
    event = b.reserved("r1", "c1")
    await appender.learn_call(event.key, event.run_id, event.event_id)
    assert db.statements == [
        Needs(frozenset({event.key}), frozenset({"r1"}), frozenset({event.event_id}))
    ]
    answer = await appender.submit(event, encode(event))
    assert answer.kind is Kind.VERDICT and answer.verdict is not None and answer.verdict.accepted
    assert len(db.statements) == 1

    outcome = b.completed(event)  # an outcome's event_id is still asked, beside its produce
    answer = await appender.submit(outcome, encode(outcome))
    assert answer.kind is Kind.VERDICT and answer.verdict is not None and answer.verdict.accepted
    assert [s.event_ids for s in db.statements[1:]] == [frozenset({outcome.event_id})]


async def test_a_fresh_runs_next_reservation_reads_nothing_before_its_append() -> None:
    """A run PostgreSQL had no row for has no calls there: its later keys are known absent
    without a statement, and only the new event_id is asked, beside the produce. A run that
    had a row and was not read whole (too many calls) still has each key it has not seen
    read."""
    db = Database()
    db.gate.set()
    log = MemoryLog("toolledger.events", partitions=1)
    while (await log.append("r0", b"")).offset < START - 1:
        pass
    appender = PartitionAppender(
        LeaderPartition(0, START, b.KEYS), log, db.load, GapReader(log, b.KEYS)
    )
    first = b.reserved("r1", "c1")
    await appender.learn_call(first.key, first.run_id, first.event_id)
    await appender.submit(first, encode(first))
    assert len(db.statements) == 1
    second = b.reserved("r1", "c2")
    await appender.learn_call(second.key, second.run_id, second.event_id)
    assert len(db.statements) == 1  # the key is known absent: nothing read before the append
    assert appender.state.knows(second.key) and appender.state.call(second.key) is None
    answer = await appender.submit(second, encode(second))
    assert answer.kind is Kind.VERDICT and answer.verdict is not None and answer.verdict.accepted
    assert db.statements[1:] == [Needs(event_ids=frozenset({second.event_id}))]

    class Existing(Database):  # the run has a row, with more calls than a load takes
        async def load(self, partition: int, needs: Needs, generation: int) -> Loaded:
            loaded = await super().load(partition, needs, generation)
            run = new_run("r2", "acme", b.at(0))
            return Loaded(loaded.stored, needs, runs={"r2": run}, generation=generation)

    old = Existing()
    old.gate.set()
    appender = PartitionAppender(
        LeaderPartition(0, START, b.KEYS), log, old.load, GapReader(log, b.KEYS)
    )
    await appender.learn_call("r2:c1", "r2")
    await appender.learn_call("r2:c2", "r2")
    assert [s.keys for s in old.statements] == [frozenset({"r2:c1"}), frozenset({"r2:c2"})]


async def test_a_run_read_whole_has_its_calls_known_and_its_new_keys_known_absent() -> None:
    """A run with a row, read with every call it has (`Loaded.whole`): memory holds those
    calls' records and knows any other key of the run does not exist, so a resumed run's
    replays and its next new call cost no statement. A run not read whole is asked again."""
    earlier = b.reserved("r3", "c1")
    record = LedgerFold(keys=b.KEYS)
    record.apply(Positioned(0, 0, earlier))

    class Whole(Database):
        async def load(self, partition: int, needs: Needs, generation: int) -> Loaded:
            loaded = await super().load(partition, needs, generation)
            runs = {r: record.runs[r] for r in needs.runs if r in record.runs}
            return Loaded(
                loaded.stored,
                needs,
                calls=dict(record.calls),
                runs=runs,
                generation=generation,
                whole=frozenset(runs) - {"r4"},
            )

    db = Whole()
    db.gate.set()
    appender = _appender(db)
    await appender.learn_call("r3:c2", "r3")
    assert len(db.statements) == 1
    state = appender.state
    assert state.knows(earlier.key) and state.call(earlier.key) == record.calls[earlier.key]
    await appender.learn_call(earlier.key, "r3")  # a replay of the earlier call
    await appender.learn_call("r3:c9", "r3")  # a new call
    assert len(db.statements) == 1
    assert state.call("r3:c9") is None

    record.apply(Positioned(0, 1, b.reserved("r4", "c1")))  # a run with a row, not read whole
    await appender.learn_call("r4:c2", "r4")
    await appender.learn_call("r4:c3", "r4")
    assert [s.keys for s in db.statements[1:]] == [frozenset({"r4:c2"}), frozenset({"r4:c3"})]
    assert not state.knows("r4:c1")  # loaded with the run, but not used: the run is not whole


async def test_a_reader_given_up_on_does_not_cancel_the_others() -> None:
    db = Database()
    appender = _appender(db)
    impatient = asyncio.create_task(appender.learn_call("r1:c1", "r1"))
    patient = asyncio.create_task(appender.learn_call("r2:c1", "r2"))
    await asyncio.sleep(0)
    impatient.cancel()
    await asyncio.sleep(0)
    db.gate.set()
    await patient
    assert impatient.cancelled()
    assert appender.state.knows("r1:c1") and appender.state.knows("r2:c1")


async def test_rows_from_another_owner_supersede_the_partition_for_every_reader() -> None:
    """PostgreSQL holding an offset this leader never committed means another owner took the
    partition: each waiting reader hears `LeaderSuperseded`, and the partition answers no more."""
    db = Database(stored=START + 100)
    appender = _appender(db)
    readers = [asyncio.create_task(appender.learn_call(f"r{n}:c1", f"r{n}")) for n in range(3)]
    await asyncio.sleep(0)
    db.gate.set()
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(r, LeaderSuperseded) for r in results), results
    assert appender.state.superseded is not None
    assert not appender.state.knows("r0:c1")


async def test_closing_answers_waiting_readers() -> None:
    db = Database()
    appender = _appender(db)
    reader = asyncio.create_task(appender.learn_call("r1:c1", "r1"))
    await asyncio.sleep(0)
    await appender.close()
    with pytest.raises(LeaderSuperseded):
        await reader


async def test_frames_sent_in_one_turn_leave_together_whole_and_in_order() -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(1 << 20):
            await received.put(chunk)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = FrameWriter(writer)
    frames = [encode_frame(Kind.VERDICT, n, b"x" * n) for n in range(1, 30)]
    for frame in frames:
        out.send(frame)
    assert writer.transport.get_write_buffer_size() == 0  # nothing written inside the turn
    await asyncio.sleep(0)  # the turn's write ran
    data = b""
    while len(data) < sum(map(len, frames)):
        data += await asyncio.wait_for(received.get(), 5)
    assert data == b"".join(frames)
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    got = [await read_frame(stream) for _ in frames]
    assert [f.request for f in got if f is not None] == list(range(1, 30))
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    del reader
