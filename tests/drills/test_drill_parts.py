"""The drill's parts on their own: each check catches the violation it names, the scripted
model is a function of its transcript, kill plans parse, billing's void is forever.

A check that cannot fail proves nothing, so every check of `toolledger.drill.checks` is shown
here to fail on a ledger that breaks its guarantee, and to pass on one that keeps it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tests.drills.evidence import call, entry, failed, healthy
from toolledger.drill.billing import DrillBilling, Effect, KeyVoided
from toolledger.drill.checks import Evidence, Refold, judge
from toolledger.drill.killpoints import KILL_KINDS, KillPlan, kinds_owed
from toolledger.drill.model import TENANT, next_turn, tool_for
from toolledger.drill.reset import ResetEvidence, judge_reset
from toolledger.drill.run import DrillConfig, default_timeout
from toolledger.errors import ExitStatus
from toolledger.events.records import RunRecord
from toolledger.runtime.runs import FinalAnswer


def test_the_model_retries_a_failed_step_with_a_new_call_id_and_then_names_every_credit() -> None:
    """A run resumed anywhere must get the same next step: the answer depends only on the
    transcript (a failed call is retried under a new id; done, it lists the credits)."""
    first = next_turn("r1", 2, [{"role": "user", "content": "go"}])
    assert isinstance(first, list) and [c.id for c in first] == ["s0"]
    assert first[0].tool == tool_for("r1", 0)
    assert first[0].arguments["memo"] == "r1/s0"
    failed = [{"role": "tool", "tool_call_id": "s0", "status": "failed", "content": '"x"'}]
    retry = next_turn("r1", 2, failed)
    assert isinstance(retry, list) and [c.id for c in retry] == ["s0r1"]
    done = [
        *failed,
        {
            "role": "tool",
            "tool_call_id": "s0r1",
            "status": "completed",
            "content": '{"credit_id": "a"}',
        },
        {
            "role": "tool",
            "tool_call_id": "s1",
            "status": "completed",
            "content": '{"credit_id": "b"}',
        },
    ]
    answer = next_turn("r1", 2, done)
    assert isinstance(answer, FinalAnswer) and answer.text.endswith(": a, b")
    assert next_turn("r1", 2, done) == answer


def test_kill_plans_round_trip_and_refuse_unknown_points() -> None:
    plan = KillPlan("response_lost", 3)
    assert KillPlan.parse(plan.encode()) == plan
    assert KillPlan.parse("none") == KillPlan()
    for bad in ("nowhere:1", "model:0", "model"):
        with pytest.raises(ValueError, match="expected none or POINT:N"):
            KillPlan.parse(bad)


def test_billing_makes_one_credit_per_key_and_a_void_is_forever(tmp_path: Path) -> None:
    """The judge of "one effect": a repeated key gets the first credit back (and is counted),
    and a key voided by a lookup that found nothing can never be charged afterwards."""
    billing = DrillBilling(tmp_path / "billing.db")
    first = billing.credit("a", 100, "r1/s0", key="r1:s0")
    assert billing.credit("a", 100, "r1/s0", key="r1:s0") == first
    assert billing.lookup("r1:s0", void=True) == first
    assert billing.lookup("r1:s1", void=False) is None
    assert billing.lookup("r1:s1", void=True) is None
    with pytest.raises(KeyVoided, match="voided"):
        billing.credit("a", 101, "r1/s1", key="r1:s1")
    assert [e.key for e in billing.effects()] == ["r1:s0"]
    assert billing.requests() == {
        "r1:s0": Counter(credited=1, replayed=1),
        "r1:s1": Counter(refused=1),
    }
    assert billing.voided() == {"r1:s1"}


# -- the checks --------------------------------------------------------------------------------


def test_a_ledger_that_keeps_its_guarantees_passes_every_check() -> None:
    evidence = healthy()
    assert failed(evidence) == set()
    tally = judge(evidence)[1]
    assert (tally.keys, tally.completed, tally.failed, tally.duplicates) == (3, 2, 1, 0)
    assert tally.unknowns == 1  # the reconciled one


def test_a_second_charge_of_one_step_under_a_new_key_is_a_duplicate_effect() -> None:
    """The idempotency key cannot stop a run that retried a step whose first call took effect
    (the ledger said failed while billing had the credit): only the memo shows it."""
    evidence = healthy()
    evidence.effects.append(Effect("r1:s0", "cr_z", "r1/s0"))
    evidence.requests = {**evidence.requests, "r1:s0": Counter(credited=1)}
    assert failed(evidence) == {
        "at most one external effect per key and per step",
        "exactly one effect for every call of a finished run",
        "the ledger tells the truth about effects",
    }


def test_a_completed_call_that_reached_billing_twice_ran_twice() -> None:
    evidence = healthy()
    evidence.requests = {**evidence.requests, "r1:s1": Counter(credited=1, replayed=1)}
    assert failed(evidence) == {"no completed call ran twice"}


def test_a_request_without_a_ledger_record_or_an_event_applied_twice_is_caught() -> None:
    evidence = healthy()
    evidence.requests = {**evidence.requests, "r1:ghost": Counter(credited=1)}
    assert "exactly one ledger record per key" in failed(evidence)
    evidence = healthy()
    history = evidence.snapshot.history
    twice = replace(
        evidence.snapshot, history=[*history, history[0].model_copy(update={"offset": 20})]
    )
    evidence.snapshot = twice
    assert failed(evidence) == {"exactly one ledger record per key"}


def test_an_unsettled_call_missing_from_the_operator_listing_is_a_violation() -> None:
    evidence = healthy()
    evidence.listing.missing.add("r1:s2")
    assert failed(evidence) == {"every unsettled call listed by the operator API"}
    evidence = healthy()
    evidence.unsettled_at_end = {"r1:s2"}
    assert failed(evidence) == {"every unsettled call listed by the operator API"}


def test_a_ledger_that_a_refold_does_not_reproduce_is_a_violation() -> None:
    evidence = healthy()
    evidence.refold = Refold("abc", "abd", 4, [])
    assert failed(evidence) == {"the ledger equals a re-fold of the log"}


def test_a_model_told_another_credit_than_billing_made_is_a_violation() -> None:
    evidence = healthy()
    runs = evidence.snapshot.history
    told = [*runs[:-1], entry("r1", 9, "run_finished", {"detail": "charged: cr_a, cr_x"})]
    evidence.snapshot = replace(evidence.snapshot, history=told)
    assert failed(evidence) == {"exactly one effect for every call of a finished run"}


FINISHED = "every run finished within the drill's timeout"
KILLS = "every kind of runtime kill delivered"


def test_an_unfinished_run_and_no_kills_at_all_are_violations() -> None:
    evidence = healthy()
    evidence.snapshot.runs["r1"] = RunRecord(run_id="r1", tenant_id=TENANT, version=5)
    evidence.kills = Counter()
    assert {FINISHED, KILLS} <= failed(evidence)


def test_fewer_kills_than_planned_pass_when_every_kind_struck_and_fail_when_one_never_did() -> None:
    """A loaded machine failed a drill on "28 of 30 requested" although every kind of kill had
    struck: plans miss when their worker finishes first. The check asks for every kind (as
    many kinds as kills were planned), not for the count; a kind never delivered fails it."""
    evidence = healthy()
    evidence.kills_requested = 30
    evidence.kills = Counter({kind: 4 for kind in KILL_KINDS})
    assert failed(evidence) == set()
    assert sum(evidence.kills.values()) < 30
    evidence.kills = Counter({kind: 5 for kind in KILL_KINDS if kind != "response_lost"})
    assert failed(evidence) == {KILLS}
    check = next(c for c in judge(evidence)[0] if c.name == KILLS)
    assert "never delivered: response_lost" in check.detail
    evidence.kills_requested, evidence.kills = 2, Counter(model=1, external=1)
    assert failed(evidence) == set()


def test_the_driver_aims_at_the_kinds_of_kill_still_owed() -> None:
    """A kind whose plan missed must be planned again, and a kind a live worker already
    carries must not be planned twice."""
    done = Counter(model=3, reserved=1)
    assert kinds_owed(KILL_KINDS, done, ["request_lost", None]) == [
        "response_lost",
        "before_outcome",
        "after_outcome",
        "external",
    ]
    assert kinds_owed(KILL_KINDS, Counter(dict.fromkeys(KILL_KINDS, 1)), []) == []


def test_a_drill_that_ran_out_of_time_says_so_and_calls_in_flight_are_not_lies() -> None:
    """The long drill on a slow machine ran out of its timeout and then reported its calls
    still in flight as "the ledger tells the truth about effects: VIOLATED". A time-out must
    be reported as one, and a credit whose call is unsettled at that moment is in flight."""
    evidence = healthy()
    evidence.calls = 3
    evidence.snapshot.calls["r1:s2"] = call("r1:s2", "started")
    evidence.snapshot.runs["r1"] = RunRecord(run_id="r1", tenant_id=TENANT, version=5)
    evidence.effects.append(Effect("r1:s2", "cr_c", "r1/s2"))
    evidence.requests = {**evidence.requests, "r1:s2": Counter(credited=1)}
    assert "the ledger tells the truth about effects" in failed(evidence)
    evidence.timed_out, evidence.timeout = True, 1800.0
    checks = {c.name: c for c in judge(evidence)[0]}
    assert failed(evidence) == {FINISHED}
    assert checks[FINISHED].failed_as == "TIMED OUT"
    assert (
        "timed out after 1800 s with 0 of 1 runs completed in the ledger" in checks[FINISHED].detail
    )
    assert (
        "in flight at the time-out (1" in checks["the ledger tells the truth about effects"].detail
    )
    # A failed call that took effect is a lie, time-out or not.
    evidence.snapshot.calls["r1:s2"] = call("r1:s2", "failed")
    assert "the ledger tells the truth about effects" in failed(evidence)


def test_the_default_timeout_follows_the_work() -> None:
    """A fixed hour ran out at 426 of 1,000 runs on a machine 2.5 times slower: the default
    must grow with the runs, calls and kills, and the command must say what it is."""
    from click.testing import CliRunner

    from toolledger.cli.drill import drill

    ci, long = DrillConfig(), DrillConfig(runs=1000, calls=5, kills=2000, partitions=16)
    assert default_timeout(long) > 4 * default_timeout(ci)
    # The slow machine's rate (426 runs an hour) would finish the long drill in time.
    assert default_timeout(long) > 1.5 * 3600 * 1000 / 426
    assert DrillConfig(timeout=60).time_limit == 60
    shown = CliRunner().invoke(drill, ["--help"], terminal_width=200).output
    assert f"{default_timeout(ci):,.0f} s for the defaults" in shown


def _poisoned(evidence: Evidence, *, dead_letters: int = 1, quarantined: bool = True) -> Evidence:
    """`evidence` with one poisoned record appended under run `poison-0`."""
    runs = dict(evidence.snapshot.runs)
    runs["poison-0"] = RunRecord(run_id="poison-0", tenant_id=None, quarantined=quarantined)
    evidence.snapshot = replace(evidence.snapshot, runs=runs, dead_letters=dead_letters)
    evidence.poison = ["poison-0"]
    return evidence


def test_poison_that_is_not_dead_lettered_or_quarantined_or_that_hits_a_drill_run_is_caught() -> (
    None
):
    """Undecodable bytes must land in the dead letters and quarantine their own run only: a
    poisoned record folded as nothing, a poisoned run left open, or a drill run quarantined by
    someone else's poison are each a violation."""
    assert failed(_poisoned(healthy())) == set()
    assert failed(_poisoned(healthy(), dead_letters=0)) == {"poison events dead-lettered"}
    assert failed(_poisoned(healthy(), quarantined=False)) == {"poison events dead-lettered"}
    evidence = _poisoned(healthy())
    evidence.snapshot.runs["r1"] = evidence.snapshot.runs["r1"].model_copy(
        update={"quarantined": True}
    )
    assert failed(evidence) == {"poison events dead-lettered"}


def test_an_error_in_a_runtime_or_a_chaos_action_is_a_violation() -> None:
    """A worker that crashed on an exception, or a trouble the drill meant to cause and could
    not, means the drill did not test what it says it did."""
    evidence = healthy()
    evidence.errors = ["chaos action kill_listen: OSError('connection refused')"]
    assert failed(evidence) == {"no unexpected runtime errors"}


def test_a_projector_stopped_by_the_identity_check_on_an_intact_log_is_a_violation() -> None:
    """The log-identity stop is for a broker that lost its data; on an intact log it is a
    false alarm that would halt production."""
    evidence = healthy()
    evidence.identity_stops = ["projector-3: toolledger projector: stopped: epoch marker gone"]
    assert failed(evidence) == {"no projector stopped with the log-identity error on an intact log"}


def test_a_zombie_projector_that_did_not_stand_down_is_a_violation() -> None:
    """A resumed zombie that never noticed it lost its partitions may write as a second owner."""
    evidence = healthy()
    evidence.zombies, evidence.zombies_stood_down = 2, 2
    assert failed(evidence) == set()
    evidence.zombies_stood_down = 1
    assert failed(evidence) == {"zombie projectors stood down"}


def test_a_runtime_worker_killed_at_no_known_point_is_a_violation() -> None:
    """Every SIGKILL of a worker is the drill's own (a kill point or the external killer); one
    nobody sent means something else killed it, and the kill count would lie."""
    evidence = healthy()
    evidence.unattributed_kills = 1
    assert failed(evidence) == {KILLS}


def _reset(**changes: object) -> set[str]:
    healthy = ResetEvidence(
        stopped=[True, True],
        projector_codes=[ExitStatus.LOG_MISMATCH, ExitStatus.LOG_MISMATCH],
        late_code=ExitStatus.LOG_MISMATCH,
        probe={"run": "probe-after-reset", "status": "unavailable", "detail": "no verdict"},
        requests_before=7,
        requests_after=7,
        digest_before="abc",
        digest_after="abc",
    )
    return {c.name for c in judge_reset(replace(healthy, **changes)) if not c.ok}  # type: ignore[arg-type]


def test_each_broker_reset_check_fails_when_what_must_follow_a_reset_does_not() -> None:
    """After the broker lost its data, projectors must stop with the identity error, a new run
    must fail closed without reaching billing, and PostgreSQL must be untouched."""
    stops = "broker reset stops the projectors"
    closed = "runtimes fail closed after a broker reset"
    assert _reset() == set()
    assert _reset(stopped=[True, False], projector_codes=[ExitStatus.LOG_MISMATCH, None]) == {stops}
    assert _reset(late_code=None) == {stops}
    assert _reset(stopped=[]) == {stops}
    assert _reset(probe={"run": "probe-after-reset", "status": "completed"}) == {closed}
    assert _reset(probe=None) == {closed}
    assert _reset(requests_after=8) == {closed}
    assert _reset(digest_after="abd") == {"nothing in PostgreSQL lost in a broker reset"}


def test_the_drill_command_refuses_more_kills_than_its_work_can_absorb() -> None:
    """400 runs cannot absorb 2,000 kills (a run of that shape delivered 1,409 and failed its
    kill check): the command must say so before it starts anything."""
    from click.testing import CliRunner

    from toolledger.cli.drill import drill, kill_capacity

    assert kill_capacity(1000, 5) == 4500 and kill_capacity(400, 5) == 1800
    result = CliRunner().invoke(drill, ["--runs", "400", "--kills", "2000"])
    assert result.exit_code == 2
    assert "--kills" in result.output and "at most 1800" in result.output
