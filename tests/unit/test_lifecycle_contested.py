"""The contested rule (decider rules v2): a late outcome that contradicts a settlement.

A settled call never changes status because of a late outcome (guarantee 6), but a `completed`
that arrives for the reservation an operator (or a reconcile hook) settled `failed` is evidence
of an effect: the call is flagged contested so that nobody reruns it until an operator decides
again. Each test names the failure it guards.
"""

from __future__ import annotations

from tests.builders import (
    completed,
    failed,
    found,
    indeterminate,
    not_found,
    reserved,
    resolved,
)
from tests.unit.test_lifecycle import Ledger
from toolledger.events.models import CallCompleted


def _operator_failed(ledger: Ledger) -> CallCompleted:
    """A write timed out (indeterminate), an operator settled it failed; its late completed."""
    r = reserved(timeout=10)
    ledger.apply(r, indeterminate(r, t=11), resolved(r, 2, outcome="failed", t=60))
    return completed(r, t=61)


def test_a_late_completed_after_an_operators_failed_contests_the_call_and_keeps_the_status() -> (
    None
):
    """The late completed must not overwrite the operator, and must not vanish either."""
    ledger = Ledger()
    late = _operator_failed(ledger)
    v = ledger.apply(late)
    assert (v.accepted, v.reason) == (False, "late_outcome")
    assert v.call is not None
    assert (v.call.status, v.call.settled_by, v.call.contested) == ("failed", "operator", True)
    assert v.call.version == 4
    assert v.call.contested_evidence is not None
    assert str(late.event_id) in v.call.contested_evidence
    assert "contested" in v.detail


def test_a_contested_failed_call_is_not_reserved_again() -> None:
    """The ledger held proof that the first attempt took effect and ran the tool again."""
    ledger = Ledger()
    ledger.apply(_operator_failed(ledger))
    v = ledger.apply(reserved(t=70))
    assert (v.accepted, v.reason) == (False, "contested")
    assert "resolves it again" in v.detail


def test_an_operators_new_decision_clears_the_contest() -> None:
    """Once an operator decided again (with the contested version), the call is ordinary."""
    ledger = Ledger()
    late = _operator_failed(ledger)
    ledger.apply(late)
    r = reserved(timeout=10)  # same key, same arguments: the builders' defaults
    stale = ledger.apply(resolved(r, 3, outcome="completed", t=80))
    assert (stale.accepted, stale.reason) == (False, "version_mismatch")
    v = ledger.apply(resolved(r, 4, outcome="completed", t=81))
    assert v.accepted and v.call is not None
    assert (v.call.status, v.call.contested, v.call.contested_evidence) == (
        "completed",
        False,
        None,
    )


def test_confirming_failed_on_a_contested_call_makes_it_rerunnable_again() -> None:
    """An operator who checked and still says failed takes responsibility for the rerun."""
    ledger = Ledger()
    ledger.apply(_operator_failed(ledger))
    r = reserved(timeout=10)
    assert ledger.apply(resolved(r, 4, outcome="failed", t=81)).accepted
    assert ledger.apply(reserved(t=90)).accepted


def test_a_late_completed_after_a_reconcile_failed_contests_the_call() -> None:
    """A reconcile hook that found nothing can be wrong too."""
    ledger = Ledger()
    r = reserved(timeout=10)
    ledger.apply(r, indeterminate(r, t=11), not_found(r, 2, t=12))
    v = ledger.apply(completed(r, t=13))
    assert v.call is not None and v.call.contested and v.call.status == "failed"


def test_a_late_failed_after_an_operators_completed_is_only_flagged() -> None:
    """A completed call stays completed and its result is still served."""
    ledger = Ledger()
    r = reserved(timeout=10)
    ledger.apply(r, indeterminate(r, t=11), resolved(r, 2, outcome="completed", t=60))
    v = ledger.apply(failed(r, t=61))
    assert v.call is not None
    assert (v.call.status, v.call.contested) == ("completed", True)
    again = ledger.apply(reserved(t=70))
    assert (again.accepted, again.reason) == (False, "already_completed")


def test_a_runtimes_own_outcomes_never_contest() -> None:
    """Only a settlement by someone else than the runtime can be contradicted."""
    ledger = Ledger()
    r = reserved()
    ledger.apply(r, failed(r, t=1))
    v = ledger.apply(completed(r, t=2))
    assert v.call is not None and not v.call.contested


def test_an_outcome_of_an_older_reservation_does_not_contest_the_new_one() -> None:
    """Evidence about another reservation says nothing about the settled one."""
    ledger = Ledger()
    r1 = reserved()
    ledger.apply(r1, failed(r1, t=1, not_attempted=True))
    r2 = reserved(t=2, timeout=10)
    ledger.apply(r2, indeterminate(r2, t=3), resolved(r2, 4, outcome="failed", t=60))
    v = ledger.apply(found(r1, 5, t=61))
    assert v.call is not None and not v.call.contested


def test_a_v1_late_completed_does_not_contest_so_old_logs_fold_as_before() -> None:
    """Rules are versioned with the event schema: a v1 log must fold to its recorded ledger."""
    ledger = Ledger()
    late = _operator_failed(ledger).model_copy(update={"schema_version": 1})
    v = ledger.apply(late)
    assert v.call is not None and not v.call.contested
    assert ledger.apply(reserved(t=70)).accepted
