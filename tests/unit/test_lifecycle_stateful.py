"""Random interleavings of everything that can reach the decider, checked against its promises.

Several drivers reserve the same keys (one run fenced by checkpoints, one bare), runtimes report
outcomes for current and stale reservations, reconcilers and operators race with stale versions,
unsigned operator events and duplicates are thrown in, and time moves forward by random steps.
After every event the invariants from docs/architecture.md must hold.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests import builders as b
from tests.unit.test_trusted import assert_as_validated
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.lifecycle import decide
from toolledger.events.models import (
    CallAbandoned,
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallReserved,
    CallResolved,
    Event,
    OperatorEvent,
    ReconcileAttempted,
)
from toolledger.events.records import SETTLED, CallRecord

RUNS = ("r1", "r2")  # r1 is driven with checkpoints (fenced), r2 is a bare ledger run
CALLS = ("c1", "c2", "c3")
DRIVERS = ("A", "B")
OUTCOMES = (CallCompleted, CallFailed, CallIndeterminate, ReconcileAttempted, CallAbandoned)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fold = LedgerFold(keys=b.KEYS)
        self.t = 0.0
        self.offset = 0
        self.applied: list[Event] = []
        self.reservations: list[CallReserved] = []
        self.driver_version = dict.fromkeys(DRIVERS, 0)
        self.unsigned: set[object] = set()
        self.contested = 0
        self._apply(b.run_started("r1"))

    # -- the one place events enter, with per-event invariants --------------------------------

    def _apply(self, event: Event) -> None:
        before_call: CallRecord | None = (
            self.fold.calls.get(event.key) if event.tool_call_id is not None else None
        )
        before_run = self.fold.runs.get(event.run_id)
        self.offset += 1
        verdict = self.fold.apply(Positioned(0, self.offset, event))
        if verdict is None:
            assert any(e.event_id == event.event_id for e in self.applied)
            assert self.fold.calls.get(event.key) == before_call
            return
        self.applied.append(event)
        after_call = self.fold.calls.get(event.key) if event.tool_call_id is not None else None
        assert_as_validated(verdict)  # the decider's records are what validation would make
        assert_as_validated(self.fold.history[-1])

        if before_call is not None:
            assert after_call is not None
            assert after_call.version >= before_call.version, "a version moved backwards"
            if after_call != before_call:
                assert after_call.version == before_call.version + 1
        if not verdict.accepted and after_call != before_call:
            self._check_contest(event, before_call, after_call)
        if before_call is not None and before_call.contested and after_call is not None:
            if not after_call.contested:
                assert isinstance(event, CallResolved) and verdict.accepted, (
                    "a contested call was cleared by something else than an operator's resolve"
                )
            if before_call.status == "failed":
                assert not (isinstance(event, CallReserved) and verdict.accepted), (
                    "a contested failed call was reserved again"
                )

        if isinstance(event, CallReserved) and verdict.accepted:
            assert before_call is None or before_call.status in ("failed", "approved"), (
                f"second reservation accepted while {before_call.status}"
            )
            if event.run_version is not None:
                assert before_run is not None and before_run.version == event.run_version
                assert event.tool_call_id in before_run.checkpoint_calls
        if isinstance(event, CallReserved) and event.run_version is not None:
            stale = before_run is not None and before_run.version != event.run_version
            assert not (stale and verdict.accepted), "a stale driver's reservation was accepted"

        if isinstance(event, OUTCOMES) and before_call is not None and after_call != before_call:
            assert before_call.reservation_id == event.reservation_id, (
                "an outcome for a reservation that is not current changed the record"
            )
            assert after_call is not None
            assert before_call.status not in SETTLED or after_call.status == before_call.status, (
                "a late outcome changed a settled record's status"
            )
            if after_call.contested and not before_call.contested:
                self.contested += 1

        if isinstance(event, OperatorEvent) and event.event_id in self.unsigned:
            assert not verdict.accepted, "an unsigned operator event was accepted"

    def _check_contest(
        self, event: Event, before: CallRecord | None, after: CallRecord | None
    ) -> None:
        """A rejected event changes a record only to flag a contradicted settlement."""
        assert before is not None and after is not None, "a rejected event created a record"
        assert after == before.model_copy(
            update={
                "contested": True,
                "contested_evidence": after.contested_evidence,
                "version": before.version + 1,
                "updated_at": event.occurred_at,
            }
        ), "a rejected event changed the record beyond flagging it contested"
        assert not before.contested and before.settled_by in ("operator", "reconcile")
        assert isinstance(event, CallCompleted | CallFailed)
        assert event.reservation_id == before.reservation_id
        wanted = CallCompleted if before.status == "failed" else CallFailed
        assert isinstance(event, wanted), f"{event.type} contested a {before.status} call"

    # -- rules ------------------------------------------------------------------------------

    @rule(dt=st.floats(min_value=0, max_value=40))
    def tick(self, dt: float) -> None:
        self.t += dt

    @rule(driver=st.sampled_from(DRIVERS), calls=st.lists(st.sampled_from(CALLS), max_size=3))
    def checkpoint(self, driver: str, calls: list[str]) -> None:
        e = b.checkpointed("r1", self.driver_version[driver], tuple(calls), t=self.t)
        self._apply(e)
        run = self.fold.runs["r1"]
        if run.version is not None and self.fold.verdicts[e.event_id].accepted:
            self.driver_version[driver] = run.version

    @rule(driver=st.sampled_from(DRIVERS))
    def reload(self, driver: str) -> None:
        """A driver reloads the run's latest checkpoint (as a recovered process would)."""
        version = self.fold.runs["r1"].version
        assert version is not None
        self.driver_version[driver] = version

    @rule(
        run=st.sampled_from(RUNS),
        call=st.sampled_from(CALLS),
        driver=st.sampled_from(DRIVERS),
        approval=st.booleans(),
        other_args=st.booleans(),
        timeout=st.floats(min_value=1, max_value=60),
    )
    def reserve(
        self, run: str, call: str, driver: str, approval: bool, other_args: bool, timeout: float
    ) -> None:
        e = b.reserved(
            run,
            call,
            run_version=self.driver_version[driver] if run == "r1" else None,
            requires_approval=approval,
            arguments={"amount_cents": 1} if other_args else None,
            t=self.t,
            timeout=timeout,
        )
        self.reservations.append(e)
        self._apply(e)

    @precondition(lambda self: self.reservations)
    @rule(
        i=st.integers(min_value=0),
        kind=st.sampled_from(["completed", "failed", "not_attempted", "indeterminate", "abandon"]),
    )
    def runtime_outcome(self, i: int, kind: str) -> None:
        r = self.reservations[i % len(self.reservations)]
        e: Event
        match kind:
            case "completed":
                e = b.completed(r, t=self.t)
            case "failed":
                e = b.failed(r, t=self.t)
            case "not_attempted":
                e = b.failed(r, t=self.t, not_attempted=True)
            case "indeterminate":
                e = b.indeterminate(r, t=self.t)
            case _:
                e = b.abandoned(r, t=self.t)
        self._apply(e)

    def _version(self, r: CallReserved, skew: int) -> int:
        call = self.fold.calls.get(r.key)
        return (call.version if call is not None else 1) + skew

    @precondition(lambda self: self.reservations)
    @rule(
        i=st.integers(min_value=0),
        kind=st.sampled_from(["found", "not_found", "attempted"]),
        skew=st.sampled_from([0, 0, 0, -1]),
    )
    def reconcile(self, i: int, kind: str, skew: int) -> None:
        r = self.reservations[i % len(self.reservations)]
        version = self._version(r, skew)
        builder = {"found": b.found, "not_found": b.not_found, "attempted": b.attempted}[kind]
        self._apply(builder(r, version, t=self.t))

    @precondition(lambda self: self.reservations)
    @rule(
        i=st.integers(min_value=0),
        kind=st.sampled_from(["resolve_completed", "resolve_failed", "approve", "reject", "undo"]),
        signed=st.booleans(),
        skew=st.sampled_from([0, 0, -1]),
    )
    def operator(self, i: int, kind: str, signed: bool, skew: int) -> None:
        r = self.reservations[i % len(self.reservations)]
        version = self._version(r, skew)
        e: OperatorEvent
        match kind:
            case "resolve_completed":
                e = b.resolved(r, version, outcome="completed", t=self.t, signed=signed)
            case "resolve_failed":
                e = b.resolved(r, version, outcome="failed", t=self.t, signed=signed)
            case "approve":
                e = b.approved(r, version, t=self.t, signed=signed)
            case "reject":
                e = b.rejected(r, version, t=self.t)
            case _:
                e = b.compensation_requested(r, version, t=self.t)
        if e.signature is None:
            self.unsigned.add(e.event_id)
        self._apply(e)

    @precondition(lambda self: self.applied)
    @rule(i=st.integers(min_value=0))
    def duplicate(self, i: int) -> None:
        """A producer retry: the same event_id appended again must change nothing."""
        event = self.applied[i % len(self.applied)]
        history_before = list(self.fold.history)
        calls_before = dict(self.fold.calls)
        runs_before = dict(self.fold.runs)
        self.offset += 1
        assert self.fold.apply(Positioned(0, self.offset, event)) is None
        assert self.fold.history == history_before
        assert self.fold.calls == calls_before
        assert self.fold.runs == runs_before

    @invariant()
    def at_most_one_live_reservation_per_key(self) -> None:
        """Of all the reservations ever made of a key, the decider would accept the runtime's
        outcome of at most one, and that one is the reservation the record names: a stale
        reservation whose outcome could still land would be a second driver of the call."""
        for key, call in self.fold.calls.items():
            assert call.key == f"{call.run_id}:{call.tool_call_id}"
            run = self.fold.runs.get(call.run_id)
            live = {
                r.reservation_id
                for r in self.reservations
                if r.key == key
                and decide(run, call, b.completed(r, t=self.t), keys=b.KEYS).accepted
            }
            assert len(live) <= 1, f"{key}: {len(live)} reservations could still complete it"
            assert live <= {call.reservation_id}, f"{key}: a stale reservation is live"
            if call.status == "started":
                assert live == {call.reservation_id}, f"{key} is started but nobody can finish it"

    def teardown(self) -> None:
        """Folding the same log again gives the same ledger: the decider is deterministic."""
        refold = LedgerFold(keys=b.KEYS)
        for n, event in enumerate(self.applied):
            refold.apply(Positioned(0, n, event))
        assert refold.calls == self.fold.calls
        assert refold.runs == self.fold.runs
        assert [h.event_id for h in refold.history] == [h.event_id for h in self.fold.history]


LedgerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestLedgerStateMachine = LedgerMachine.TestCase
