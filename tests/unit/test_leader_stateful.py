"""Leaders answering from memory, and projections following them, in every order hypothesis
can find.

The machine holds one partition's log, the projection in "PostgreSQL" (a `MemoryLedger`: its
rows, history and verdicts, and the stored offset its compare-and-set guards), and up to three
`LeaderPartition`s, each in a projector process of its own: the current owner and possibly
zombies that were superseded without being told. Rules let foreign writers append, leaders
produce (the record lands in the log at once; its acknowledgement comes later, or never),
acknowledgements arrive in any order, gap fetches return any part of the gap, acknowledgements
get lost and are resent with the same event_id, a new owner takes over, and the owner's process
restarts. A leader hands its projector every record it proves, with what it folded
(`Proven`); a projector commits from its position: the handed records as the leader folded
them, the rest fetched and given to its leader before the commit (`folding`), which folds what
it had not, and the batch is written from the leader's fold when every record has one
(`apply_folded`), else folded by the store (`apply_written`), as `Projector` does. A zombie's
compare-and-set fails.

The invariants are the fast path's promise (docs/architecture.md, "The leader fast path"):

- every verdict a leader answered equals the verdict of a reference fold of the whole log for
  that event_id, which is the fold of the log prefix up to its (first) record;
- every record a leader answered a read with equals the reference fold's record up to the
  leader's folded offset;
- after every commit the projection equals a replay of the log from its start up to the stored
  offset: calls, runs, history (chains included) and verdicts;
- a leader that found itself superseded answers nothing more.

A failure here is a verdict the fast path would have answered differently from the ledger, or
a projection that a leader's fold made differ from the log's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests import builders as b
from toolledger.events.fold import Folded, LedgerFold, Positioned
from toolledger.events.log import LogIdentity
from toolledger.events.models import CallReserved, Event
from toolledger.events.records import CallRecord, Verdict
from toolledger.leader.projector_side.partition import (
    Item,
    LeaderBehind,
    LeaderPartition,
    LeaderSuperseded,
    Loaded,
    Needs,
)
from toolledger.projections.following import Proven
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.projector import all_folded
from toolledger.projections.store import OffsetConflict

RUNS = ("r1", "r2")
CALLS = ("c1", "c2")
START = 1  # offset 0 holds the epoch marker
OUTCOMES: tuple[Callable[..., Event], ...] = (b.completed, b.failed, b.abandoned, b.indeterminate)
IDENTITY = LogIdentity("toolledger.events", uuid.uuid4(), 1)
T = TypeVar("T")


def now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the memory store's uncontended writes) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("the store suspended: this machine drives it without a loop")


class LeaderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[Event] = []  # the record at offset START + i
        self.stored = START
        self.leaders: list[LeaderPartition] = [LeaderPartition(0, START, b.KEYS)]
        self.owner = 0
        self.projected: dict[int, int] = {0: START}  # each leader's projector's position
        self.in_flight: list[tuple[int, int, Event]] = []  # (leader, offset, event)
        self.lost: list[tuple[int, Event]] = []
        self.reservations: list[CallReserved] = []
        self.answered: list[tuple[int, Verdict]] = []
        self.read_answers: list[tuple[int, str, tuple[int, CallRecord | None]]] = []
        self.stopped: set[int] = set()  # leaders that found themselves superseded
        self.loading: list[tuple[int, Loaded]] = []  # reads asked, not yet answered
        self.t = 0.0
        self.store = MemoryLedger(verify_keys=b.KEYS)
        now(self.store.bind_log(IDENTITY))
        self.handed: dict[int, list[Proven]] = {0: []}  # what each leader proved, for its projector
        self.ways: dict[str, int] = {"folded": 0, "written": 0}

    # -- the reference: the log's own fold -----------------------------------------------------

    def fold_of(self, end: int) -> LedgerFold:
        fold = LedgerFold(keys=b.KEYS)
        for i, event in enumerate(self.log[: end - START]):
            fold.apply(Positioned(0, START + i, event))
        return fold

    def item(self, offset: int) -> Item:
        return Positioned(0, offset, self.log[offset - START])

    def load(self, leader: LeaderPartition, needs: Needs, *, whole_runs: bool = False) -> Loaded:
        """What PostgreSQL answers: the rows at the stored offset, read with it; with
        `whole_runs`, every call of each asked run that has a row (`Loaded.whole`)."""
        fold = self.fold_of(self.stored)
        runs = {r: fold.runs[r] for r in needs.runs if r in fold.runs}
        whole = frozenset(runs) if whole_runs else frozenset()
        calls = {k: fold.calls[k] for k in needs.keys if k in fold.calls}
        calls |= {k: c for k, c in fold.calls.items() if c.run_id in whole}
        return Loaded(
            stored=self.stored,
            needs=needs,
            calls=calls,
            runs=runs,
            decided={e: fold.verdicts[e] for e in needs.event_ids if e in fold.verdicts},
            generation=leader.generation,
            whole=whole,
        )

    def fold_into(self, index: int, items: list[Item], end: int) -> list[Folded] | None:
        """Load what the leader lacks, then fold; what it folded, None if it could not (it
        found itself superseded, or memory skipped a batch)."""
        leader = self.leaders[index]
        try:
            while needs := leader.needs(i for i in items if i.offset >= leader.next):
                leader.learn(self.load(leader, needs))
            return leader.fold(items, end)
        except LeaderBehind:
            return None  # memory skipped a batch: nothing proven until its commit
        except LeaderSuperseded:
            self.stopped.add(index)
            return None

    # -- events ---------------------------------------------------------------------------------

    def event(self, data: st.DataObject) -> Event:
        self.t += 1
        run, call = data.draw(st.sampled_from(RUNS)), data.draw(st.sampled_from(CALLS))
        outcome = bool(self.reservations) and data.draw(st.booleans())
        if outcome:
            r = data.draw(st.sampled_from(self.reservations))
            make: Callable[..., Event] = data.draw(st.sampled_from(OUTCOMES))
            return make(r, t=self.t)
        if data.draw(st.integers(0, 5)) == 0:
            return b.run_started(run, t=self.t)
        reserved = b.reserved(run, call, t=self.t)
        self.reservations.append(reserved)
        return reserved

    # -- rules ----------------------------------------------------------------------------------

    @rule(data=st.data())
    def foreign_append(self, data: st.DataObject) -> None:
        """The API, a processor or a runtime on the direct path writes to the partition."""
        self.log.append(self.event(data))

    @rule(data=st.data())
    def leader_produces(self, data: st.DataObject) -> None:
        index = data.draw(st.sampled_from(range(len(self.leaders))))
        event = self.event(data)
        self.log.append(event)
        self.in_flight.append((index, START + len(self.log) - 1, event))

    @precondition(lambda self: self.lost)
    @rule(data=st.data())
    def resend(self, data: st.DataObject) -> None:
        """A runtime resends after an ambiguous error: the same event, a new record."""
        index, event = self.lost.pop(data.draw(st.integers(0, len(self.lost) - 1)))
        self.log.append(event)
        self.in_flight.append((index, START + len(self.log) - 1, event))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def ack_lost(self, data: st.DataObject) -> None:
        index, _offset, event = self.in_flight.pop(
            data.draw(st.integers(0, len(self.in_flight) - 1))
        )
        self.lost.append((index, event))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def ack_arrives(self, data: st.DataObject) -> None:
        """The acknowledgement says the offset; the leader proves it, fetching gaps piecewise."""
        index, offset, event = self.in_flight.pop(
            data.draw(st.integers(0, len(self.in_flight) - 1))
        )
        leader = self.leaders[index]
        while leader.next <= offset and leader.superseded is None:
            if leader.next == offset:
                items, end = [self.item(offset)], offset + 1
            else:  # a fetch returns any non-empty part of the gap
                end = data.draw(st.integers(leader.next + 1, offset))
                items = [self.item(o) for o in range(leader.next, end)]
            folded = self.fold_into(index, items, end)
            if folded is None:
                return
            own = offset  # a gap's records are foreign, the acknowledged one the leader's
            self.handed[index] += [Proven(f, f.item.offset == own) for f in folded]
        if leader.superseded is not None:
            self.stopped.add(index)
            return
        verdict = leader.verdict(event.event_id)
        if verdict is None:  # memory started afresh since (`skip`): answered "not proven"
            assert leader.horizon > offset, f"leader {index} folded offset {offset}, no verdict"
            return
        self.answered.append((index, verdict))

    @rule(data=st.data())
    def projector_commits(self, data: st.DataObject) -> None:
        """A leader's projector commits from its position: what its leader handed over as it
        folded it, the rest fetched and folded by the leader before the commit (or skipped, if
        nobody asked it lately), written from the fold when every record has one."""
        index = data.draw(st.sampled_from(range(len(self.leaders))))
        leader = self.leaders[index]
        start = self.projected[index]
        end = data.draw(st.integers(start, START + len(self.log)))
        items: list[Item] = [self.item(o) for o in range(start, end)]
        taken = data.draw(st.integers(0, len(self.handed[index])))  # handed over so far
        handed = {p.offset: p.folded for p in self.handed[index][:taken] if start <= p.offset < end}
        fresh: list[Folded] = []
        idle = data.draw(st.booleans())  # nobody asked this leader lately: memory skips
        if leader.superseded is None and idle and not leader.behind:
            leader.skip(end)
        elif leader.superseded is None and not leader.behind:
            fresh = self.fold_into(index, items, end) or []
            if leader.superseded is None:
                leader.committing(end)
        folded = all_folded(items, handed, fresh)
        try:
            if folded is not None:
                self.ways["folded"] += 1
                now(self.store.apply_folded(0, start, end, folded))
            else:
                self.ways["written"] += 1
                now(self.store.apply_written(0, start, end, items))
        except OffsetConflict:
            assert self.stored != start
            leader.supersede("the offset CAS missed")
            self.stopped.add(index)
            return
        assert self.stored == start
        self.stored = self.projected[index] = end
        self.handed[index] = [p for p in self.handed[index] if p.offset >= end]
        leader.committed_to(end)

    @precondition(lambda self: self.leaders[self.owner].superseded is None)
    @rule()
    def restart(self) -> None:
        """The owner's process restarts and takes the partition again at the stored offset:
        memory, and whatever it had not handed over yet, are gone."""
        self.leaders[self.owner] = LeaderPartition(0, self.stored, b.KEYS)
        self.projected[self.owner] = self.stored
        self.handed[self.owner] = []
        self.lost += [(i, e) for i, _o, e in self.in_flight if i == self.owner]  # resent later
        self.in_flight = [(i, o, e) for i, o, e in self.in_flight if i != self.owner]

    @precondition(lambda self: len(self.leaders) < 3)
    @rule()
    def takeover(self) -> None:
        """Another process takes the lock; the old owner is not told (a zombie)."""
        self.leaders.append(LeaderPartition(0, self.stored, b.KEYS))
        self.owner = len(self.leaders) - 1
        self.projected[self.owner] = self.stored
        self.handed[self.owner] = []

    @rule(data=st.data())
    def leader_reads(self, data: st.DataObject) -> None:
        """A runtime's read of a key, with its run as `learn_call` asks it (the run read with
        all its calls, or not: too many of them)."""
        index = data.draw(st.sampled_from(range(len(self.leaders))))
        run = data.draw(st.sampled_from(RUNS))
        key = f"{run}:{data.draw(st.sampled_from(CALLS))}"
        leader = self.leaders[index]
        try:
            leader.check_current()
            if not leader.knows(key):
                runs = frozenset() if leader.knows_run(run) else frozenset({run})
                needs = Needs(keys=frozenset({key}), runs=runs)
                leader.learn(self.load(leader, needs, whole_runs=data.draw(st.booleans())))
        except LeaderBehind:
            return
        except LeaderSuperseded:
            self.stopped.add(index)
            return
        self.read_answers.append((index, key, (leader.next, leader.call(key))))

    @rule(data=st.data())
    def leader_asks_rows(self, data: st.DataObject) -> None:
        """A read asked beside a produce: PostgreSQL answers now, the leader hears it later."""
        index = data.draw(st.sampled_from(range(len(self.leaders))))
        keys = data.draw(st.frozensets(st.sampled_from([f"{r}:{c}" for r in RUNS for c in CALLS])))
        runs = data.draw(st.frozensets(st.sampled_from(RUNS)))
        leader = self.leaders[index]
        needs = Needs(keys=keys - {k for k in keys if leader.knows(k)}, runs=runs)
        self.loading.append((index, self.load(leader, needs, whole_runs=data.draw(st.booleans()))))

    @precondition(lambda self: self.loading)
    @rule(data=st.data())
    def rows_arrive(self, data: st.DataObject) -> None:
        index, loaded = self.loading.pop(data.draw(st.integers(0, len(self.loading) - 1)))
        try:
            self.leaders[index].learn(loaded)
        except LeaderBehind:
            pass
        except LeaderSuperseded:
            self.stopped.add(index)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def verdicts_are_the_logs(self) -> None:
        reference = self.fold_of(START + len(self.log)).verdicts
        for index, verdict in self.answered:
            assert verdict == reference[verdict.event_id], (index, verdict.event_id)

    @invariant()
    def the_projection_is_a_replay_of_the_log_up_to_its_offset(self) -> None:
        reference = self.fold_of(self.stored)
        fold = self.store.fold
        assert fold.calls == reference.calls
        assert fold.runs == reference.runs
        assert fold.verdicts == reference.verdicts
        assert sorted(fold.history, key=lambda e: e.offset) == reference.history
        assert now(self.store.partition_state(0)).next_offset == self.stored  # type: ignore[union-attr]

    @invariant()
    def reads_are_the_logs(self) -> None:
        for index, key, (at, record) in self.read_answers:
            assert record == self.fold_of(at).calls.get(key), (index, key, at)
        self.read_answers.clear()

    @invariant()
    def stopped_leaders_stay_stopped(self) -> None:
        for index in self.stopped:
            leader = self.leaders[index]
            assert leader.superseded is not None
            try:
                leader.fold([], leader.next)
            except LeaderSuperseded:
                continue
            raise AssertionError(f"superseded leader {index} still folds")

    @invariant()
    def the_owner_is_never_wrongly_superseded(self) -> None:
        owner = self.leaders[self.owner]
        assert self.owner in self.stopped or owner.superseded is None


TestLeaderMachine = LeaderMachine.TestCase
TestLeaderMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_resend_is_answered_with_its_first_verdict() -> None:
    """A reservation resent after a lost acknowledgement must get the verdict of its first
    record (accepted), not a rejection for the call its own first record started."""
    leader = LeaderPartition(0, START, b.KEYS)
    reserved = b.reserved()
    first, second = Positioned(0, START, reserved), Positioned(0, START + 1, reserved)
    leader.learn(Loaded(START, leader.needs([first])))
    leader.fold([first, second], START + 2)
    verdict = leader.verdict(reserved.event_id)
    assert verdict is not None and verdict.accepted


def test_rows_read_after_another_owner_committed_supersede_the_leader() -> None:
    """A zombie reading rows another owner committed must stop answering, not fold them."""
    leader = LeaderPartition(0, START, b.KEYS)
    needs = Needs(keys=frozenset({"r1:c1"}), event_ids=frozenset({uuid.uuid4()}))
    try:
        leader.learn(Loaded(START + 5, needs))
    except LeaderSuperseded:
        assert leader.superseded is not None
        return
    raise AssertionError("rows of another owner's commit were used")
