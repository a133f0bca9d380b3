"""The decider, one rule of docs/architecture.md's table per test, each named after the failure
it guards."""

from __future__ import annotations

from tests.builders import (
    KEYS,
    abandoned,
    approved,
    attempted,
    checkpointed,
    compensation_requested,
    completed,
    failed,
    found,
    indeterminate,
    not_found,
    rejected,
    reserved,
    resolved,
    run_started,
)
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.lifecycle import CLOCK_SKEW_GRACE, decide
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.events.signing import SigningKey, sign


class Ledger:
    """A fold with positions filled in, so tests read as event sequences."""

    def __init__(self) -> None:
        self.fold = LedgerFold(keys=KEYS)
        self.offset = 0

    def apply(self, *events: Event) -> Verdict:
        verdict: Verdict | None = None
        for event in events:
            self.offset += 1
            verdict = self.fold.apply(Positioned(0, self.offset, event))
        assert verdict is not None
        return verdict


def test_a_second_reservation_while_started_is_rejected_and_names_the_holder() -> None:
    ledger = Ledger()
    first = reserved()
    assert ledger.apply(first).accepted
    v = ledger.apply(reserved())
    assert not v.accepted
    assert v.reason == "held"
    assert str(first.reservation_id) in v.detail


def test_a_completed_key_is_never_reserved_again() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, completed(r))
    v = ledger.apply(reserved())
    assert (v.accepted, v.reason) == (False, "already_completed")
    assert v.call is not None and v.call.result_json == '{"ok":true}'


def test_same_key_with_different_arguments_is_a_key_conflict() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, failed(r, not_attempted=True))
    v = ledger.apply(reserved(arguments={"amount_cents": 9999}))
    assert (v.accepted, v.reason) == (False, "key_conflict")


def test_a_failed_call_may_be_reserved_again() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, failed(r, not_attempted=True))
    r2 = reserved(t=10)
    v = ledger.apply(r2)
    assert v.accepted
    assert v.call is not None
    assert (v.call.status, v.call.reservation_id, v.call.version) == (
        "started",
        r2.reservation_id,
        3,
    )
    assert not v.call.not_attempted


def test_an_outcome_for_a_reservation_that_is_not_current_is_rejected() -> None:
    ledger = Ledger()
    r1 = reserved()
    ledger.apply(r1, failed(r1, not_attempted=True))
    r2 = reserved(t=10)
    ledger.apply(r2)
    v = ledger.apply(completed(r1, t=11))
    assert (v.accepted, v.reason) == (False, "not_current_reservation")


def test_a_late_completion_after_an_operator_resolved_the_call_does_not_overwrite_it() -> None:
    ledger = Ledger()
    r = reserved(timeout=30)
    ledger.apply(r, indeterminate(r, t=31))
    ledger.apply(resolved(r, 2, outcome="failed", t=60))
    v = ledger.apply(completed(r, t=61))
    assert (v.accepted, v.reason) == (False, "late_outcome")
    assert v.call is not None and v.call.status == "failed"
    assert v.call.settled_by == "operator"
    # the late outcome is kept in the history as evidence
    assert [h.reason for h in ledger.fold.history][-1] == "late_outcome"


def test_reconcile_found_settles_an_indeterminate_call_with_the_real_result() -> None:
    ledger = Ledger()
    r = reserved()
    v = ledger.apply(r, indeterminate(r))
    assert v.call is not None
    v = ledger.apply(found(r, v.call.version))
    assert v.accepted
    assert v.call is not None
    assert (v.call.status, v.call.settled_by, v.call.result_reference) == (
        "completed",
        "reconcile",
        "cr_1",
    )


def test_a_reconcile_finding_that_saw_an_old_version_is_rejected() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, indeterminate(r))
    ledger.apply(attempted(r, 2))
    v = ledger.apply(found(r, 2))
    assert (v.accepted, v.reason) == (False, "version_mismatch")


def test_reconcile_failed_on_a_started_call_waits_for_the_deadline() -> None:
    ledger = Ledger()
    r = reserved(timeout=30)
    ledger.apply(r)
    early = ledger.apply(not_found(r, 1, t=20))
    assert (early.accepted, early.reason) == (False, "before_deadline")
    grace = CLOCK_SKEW_GRACE.total_seconds()
    late = ledger.apply(not_found(r, 1, t=30 + grace + 1))
    assert late.accepted


def test_reconcile_completed_on_a_started_call_is_accepted_before_the_deadline() -> None:
    ledger = Ledger()
    r = reserved(timeout=30)
    ledger.apply(r)
    assert ledger.apply(found(r, 1, t=2)).accepted
    # the runtime's own completion, arriving in time, is superseded by the same truth
    v = ledger.apply(completed(r, t=3))
    assert (v.accepted, v.reason) == (False, "late_outcome")


def test_an_operator_cannot_resolve_a_started_call_before_its_deadline() -> None:
    ledger = Ledger()
    r = reserved(timeout=30)
    ledger.apply(r)
    v = ledger.apply(resolved(r, 1, t=10))
    assert (v.accepted, v.reason) == (False, "before_deadline")
    assert ledger.apply(resolved(r, 1, t=100)).accepted


def test_an_unsigned_operator_event_is_rejected() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, indeterminate(r))
    v = ledger.apply(resolved(r, 2, signed=False))
    assert (v.accepted, v.reason) == (False, "unsigned")


def test_an_operator_event_signed_with_another_secret_is_rejected() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, indeterminate(r))
    forged = sign(resolved(r, 2, signed=False), SigningKey.generate("k1"))
    v = ledger.apply(forged)
    assert (v.accepted, v.reason) == (False, "bad_signature")
    tampered = resolved(r, 2).model_copy(update={"outcome": "completed"})
    assert ledger.apply(tampered).reason == "bad_signature"


def test_two_operators_resolving_the_same_version_only_one_wins() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, indeterminate(r))
    assert ledger.apply(resolved(r, 2, outcome="completed")).accepted
    v = ledger.apply(resolved(r, 2, outcome="failed"))
    assert (v.accepted, v.reason) == (False, "status_mismatch")


def test_an_event_of_another_tenant_is_rejected() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, indeterminate(r))
    v = ledger.apply(resolved(r, 2, tenant="evil"))
    assert (v.accepted, v.reason) == (False, "tenant_mismatch")
    v = ledger.apply(reserved("r1", "c9", tenant="evil"))
    assert (v.accepted, v.reason) == (False, "tenant_mismatch")


def test_abandoned_before_the_reservation_arrives_keeps_a_tombstone() -> None:
    ledger = Ledger()
    r = reserved()
    assert ledger.apply(abandoned(r)).accepted
    v = ledger.apply(r)
    assert (v.accepted, v.reason) == (False, "abandoned_reservation")
    assert ledger.fold.calls == {}


def test_abandoned_current_reservation_is_failed_not_attempted() -> None:
    ledger = Ledger()
    r = reserved()
    v = ledger.apply(r, abandoned(r))
    assert v.call is not None
    assert (v.call.status, v.call.not_attempted) == ("failed", True)


def test_compensation_of_a_not_attempted_failure_is_rejected() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, failed(r, not_attempted=True))
    v = ledger.apply(compensation_requested(r, 2))
    assert (v.accepted, v.reason) == (False, "nothing_to_undo")


def test_compensation_of_a_completed_call_moves_it_to_compensating() -> None:
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, completed(r))
    v = ledger.apply(compensation_requested(r, 2))
    assert v.accepted and v.call is not None and v.call.status == "compensating"


def test_approval_gate_then_reservation_by_the_driver_starts_the_call() -> None:
    ledger = Ledger()
    r = reserved(requires_approval=True)
    v = ledger.apply(r)
    assert v.call is not None and v.call.status == "awaiting_approval"
    v = ledger.apply(approved(r, 1))
    assert v.call is not None and v.call.status == "approved"
    v = ledger.apply(reserved(requires_approval=True, t=6))
    assert v.accepted and v.call is not None and v.call.status == "started"
    assert v.call.operator == "alice"


def test_a_rejected_approval_is_failed_not_attempted() -> None:
    ledger = Ledger()
    r = reserved(requires_approval=True)
    ledger.apply(r)
    v = ledger.apply(rejected(r, 1))
    assert v.call is not None and (v.call.status, v.call.not_attempted) == ("failed", True)


def test_a_stale_driver_cannot_checkpoint_or_reserve() -> None:
    ledger = Ledger()
    ledger.apply(run_started("r1"))
    assert ledger.apply(checkpointed("r1", 0, ("a1",))).accepted
    # a second driver that also loaded version 0 loses
    v = ledger.apply(checkpointed("r1", 0, ("b1",)))
    assert (v.accepted, v.reason) == (False, "stale_driver")
    v = ledger.apply(reserved("r1", "b1", run_version=0))
    assert (v.accepted, v.reason) == (False, "stale_driver")
    assert ledger.apply(reserved("r1", "a1", run_version=1)).accepted


def test_a_fenced_run_rejects_a_reservation_without_a_run_version() -> None:
    ledger = Ledger()
    ledger.apply(run_started("r1"), checkpointed("r1", 0, ("a1",)))
    v = ledger.apply(reserved("r1", "a1"))
    assert (v.accepted, v.reason) == (False, "missing_run_version")


def test_verdict_versions_increase_by_one_per_accepted_event() -> None:
    ledger = Ledger()
    r = reserved()
    versions = []
    for e in (r, indeterminate(r), attempted(r, 2), found(r, 3)):
        v = ledger.apply(e)
        assert v.accepted and v.call is not None
        versions.append(v.call.version)
    assert versions == [1, 2, 3, 4]


def test_decide_is_pure_the_same_inputs_give_the_same_verdict() -> None:
    r = reserved()
    assert decide(None, None, r, keys=KEYS) == decide(None, None, r, keys=KEYS)
