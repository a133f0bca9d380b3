"""The decider's rule for `run_resume_failed`: the resumer marks a paused run whose resume hook
kept raising, so the mark is part of the fold (replays and restarts keep it), and clears with
the run's next move.

Before the rule existed, a hook that raised left its run reading `awaiting_reconciliation` with
its call settled and nothing anywhere saying why it never went on.
"""

from __future__ import annotations

from tests.builders import PRODUCER, at, found, indeterminate, reserved
from tests.unit.test_lifecycle import Ledger
from tests.unit.test_lifecycle_framework_runs import paused, resumed
from toolledger.events.models import RunResumeFailed
from toolledger.events.records import RunRecord


def resume_failed(
    run_id: str = "r1", waiting_on: str = "r1:c1", *, t: float = 5, attempts: int = 5
) -> RunResumeFailed:
    return RunResumeFailed(
        key=run_id,
        run_id=run_id,
        tenant_id="acme",
        occurred_at=at(t),
        producer=PRODUCER,
        waiting_on=waiting_on,
        attempts=attempts,
        error="RuntimeError('model unreachable')",
    )


def _paused_and_settled(ledger: Ledger) -> None:
    r = reserved("r1", "c1")
    ledger.apply(r, indeterminate(r))
    ledger.apply(paused())
    ledger.apply(found(r, 2))


def test_a_resume_failure_marks_the_paused_run_with_the_error() -> None:
    """The mark must be on the run record (API, console, metrics read it), and the run stays
    paused on its call: nothing but its driver moves it on."""
    ledger = Ledger()
    _paused_and_settled(ledger)
    v = ledger.apply(resume_failed())
    assert v.accepted, v.detail
    run = v.run
    assert isinstance(run, RunRecord)
    assert (run.status, run.waiting_on) == ("awaiting_reconciliation", "r1:c1")
    assert run.resume_error is not None
    assert "5 times" in run.resume_error and "model unreachable" in run.resume_error
    assert run.updated_at == at(5)


def test_the_mark_clears_when_the_run_goes_on() -> None:
    """A hook that finally worked resumes the run: the old error must not stay on it."""
    ledger = Ledger()
    _paused_and_settled(ledger)
    ledger.apply(resume_failed())
    v = ledger.apply(resumed())
    assert v.accepted and v.run is not None
    assert (v.run.status, v.run.resume_error) == ("running", None)


def test_a_mark_about_another_pause_is_refused() -> None:
    """A resumer that read an old pause must not mark the run's current one (or a run that
    already went on) with an error it never had."""
    ledger = Ledger()
    _paused_and_settled(ledger)
    v = ledger.apply(resume_failed(waiting_on="r1:c9"))
    assert (v.accepted, v.reason) == (False, "status_mismatch")
    ledger.apply(resumed())
    v = ledger.apply(resume_failed())
    assert (v.accepted, v.reason) == (False, "status_mismatch")
    assert v.run is not None and v.run.resume_error is None


def test_a_mark_of_an_unknown_run_is_refused() -> None:
    v = Ledger().apply(resume_failed(run_id="r9", waiting_on="r9:c1"))
    assert (v.accepted, v.reason) == (False, "unknown_run")


def test_a_run_without_the_mark_digests_as_before() -> None:
    """Logs recorded before the event existed fold to the same digest: the field is left out
    of the ledger form while it holds its default."""
    run = RunRecord(run_id="r1", tenant_id="acme")
    assert "resume_error" not in run.ledger_form()
    assert run.model_copy(update={"resume_error": "x"}).ledger_form()["resume_error"] == "x"
