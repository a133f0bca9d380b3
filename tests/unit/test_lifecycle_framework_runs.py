"""The decider's rules for the pauses of runs their framework drives (no checkpoints).

A LangGraph thread, a PydanticAI or an OpenAI Agents run pauses on a call; its adapter records
`run_paused` / `run_resumed` without a version (schema v2), because the ledger holds no
checkpoint of such a run. Before, the decider refused them (`unknown_run`), so a paused thread's
record said `running` and the resumer never fired.
"""

from __future__ import annotations

from typing import Any

from tests.builders import PRODUCER, at, checkpointed, indeterminate, reserved, run_started
from tests.unit.test_lifecycle import Ledger
from toolledger.events.models import RunPaused, RunResumed


def paused(
    run_id: str = "r1", waiting_on: str | None = "r1:c1", version: int | None = None
) -> RunPaused:
    return RunPaused(
        **_envelope(run_id, 3),
        reason="awaiting_reconciliation",
        waiting_on=waiting_on,
        expected_version=version,
    )


def resumed(run_id: str = "r1", version: int | None = None) -> RunResumed:
    return RunResumed(**_envelope(run_id, 4), expected_version=version)


def _envelope(run_id: str, t: float) -> dict[str, Any]:
    return {
        "key": run_id,
        "run_id": run_id,
        "tenant_id": "acme",
        "occurred_at": at(t),
        "producer": PRODUCER,
    }


def test_a_framework_run_paused_on_an_unknown_call_says_so_and_goes_on_after() -> None:
    ledger = Ledger()
    r = reserved("r1", "c1")
    ledger.apply(r, indeterminate(r))
    v = ledger.apply(paused())
    assert v.accepted and v.run is not None
    assert (v.run.status, v.run.waiting_on, v.run.version) == (
        "awaiting_reconciliation",
        "r1:c1",
        None,
    )
    v = ledger.apply(resumed())
    assert v.accepted and v.run is not None
    assert (v.run.status, v.run.waiting_on) == ("running", None)


def test_a_pause_of_a_run_without_calls_is_refused() -> None:
    """A run the ledger never saw waits on nothing it knows; accepting would invent a run."""
    v = Ledger().apply(paused())
    assert (v.accepted, v.reason) == (False, "unknown_run")


def test_a_framework_pause_must_name_the_call_it_waits_on() -> None:
    """Without `waiting_on` the resumer could never tell when the wait is over."""
    ledger = Ledger()
    ledger.apply(reserved("r1", "c1"))
    v = ledger.apply(paused(waiting_on=None))
    assert (v.accepted, v.reason) == (False, "unknown_call")


def test_a_versioned_pause_of_a_run_without_checkpoints_is_refused() -> None:
    """A driver claiming checkpoint 3 of a run that has none is not this run's driver."""
    ledger = Ledger()
    ledger.apply(reserved("r1", "c1"))
    v = ledger.apply(paused(version=3))
    assert (v.accepted, v.reason) == (False, "unknown_run")


def test_a_checkpointed_run_still_fences_a_pause_without_its_version() -> None:
    """An unversioned pause must not slip past the fencing of a run `AgentRun` drives."""
    ledger = Ledger()
    ledger.apply(run_started("r1"), checkpointed("r1", 0, ("c1",)))
    v = ledger.apply(paused())
    assert (v.accepted, v.reason) == (False, "stale_driver")
    assert ledger.apply(paused(version=1)).accepted
