"""The reconciler's pure parts: when a call is due, how its table entry folds facts, and which
request a hook's answer becomes. Time comes from the records, as in the running reconciler."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from tests.builders import at, indeterminate, reserved
from tests.integration import reconcile_tools
from tests.integration.procs import until
from toolledger import ReconcileOutcome, ToolContext, Toolset, external
from toolledger.events.lifecycle import CLOCK_SKEW_GRACE
from toolledger.events.models import CallCompleted, CallFailed, ReconcileAttempted
from toolledger.events.records import CallRecord, CallStatus, Verdict
from toolledger.processors.reconciler import Reconciler, collect_tools
from toolledger.processors.schedule import (
    ReconcilePolicy,
    backoff,
    exhausted,
    is_due,
    next_attempt_at,
)
from toolledger.processors.unsettled import UnsettledRun, fold_fact, parse_facts
from toolledger.projections.facts import Fact
from toolledger.runtime.reconcile import finding_for
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

POLICY = ReconcilePolicy(
    max_attempts=4, backoff=timedelta(seconds=2), max_backoff=timedelta(seconds=10)
)


def record(
    status: CallStatus = "indeterminate",
    *,
    attempts: int = 0,
    updated: float = 100,
    deadline: float = 30,
    version: int = 2,
    key: str = "r1:c1",
) -> CallRecord:
    run_id, _, tool_call_id = key.partition(":")
    return CallRecord(
        key=key,
        run_id=run_id,
        tool_call_id=tool_call_id,
        tenant_id="acme",
        tool="billing.issue_credit",
        effect="external",
        status=status,
        version=version,
        reservation_id=uuid.UUID(int=7),
        args_digest="d",
        arguments_json="{}",
        requires_approval=False,
        deadline=at(deadline),
        reconcile_attempts=attempts,
        created_at=at(0),
        updated_at=at(updated),
    )


# --- the schedule ---------------------------------------------------------------------------


def test_an_indeterminate_call_is_asked_about_at_once() -> None:
    assert next_attempt_at(record(), POLICY) == at(100)
    assert is_due(record(), POLICY, at(100))


def test_a_started_call_is_not_asked_about_while_its_runtime_may_still_finish_it() -> None:
    started = record("started", updated=0, deadline=30)
    grace = CLOCK_SKEW_GRACE.total_seconds()
    assert not is_due(started, POLICY, at(30))
    assert not is_due(started, POLICY, at(30 + grace - 0.001))
    assert is_due(started, POLICY, at(30 + grace))


def test_a_lease_makes_a_started_call_due_before_its_deadline() -> None:
    leased = ReconcilePolicy(lease=timedelta(seconds=5))
    started = record("started", updated=0, deadline=3600)
    assert not is_due(started, leased, at(4.9))
    assert is_due(started, leased, at(5))


def test_backoff_doubles_after_each_unknown_up_to_its_cap() -> None:
    waits = [backoff(POLICY, n).total_seconds() for n in range(6)]
    assert waits == [0, 2, 4, 8, 10, 10]


def test_a_huge_attempt_count_cannot_overflow_the_backoff() -> None:
    assert backoff(POLICY, 10**9) == POLICY.max_backoff


def test_after_an_unknown_the_next_question_waits_for_the_backoff() -> None:
    """A hook that cannot tell must not be asked again in a tight loop."""
    after_two = record(attempts=2, updated=100)
    assert next_attempt_at(after_two, POLICY) == at(104)
    assert not is_due(after_two, POLICY, at(103.9))
    assert is_due(after_two, POLICY, at(104))


def test_a_started_call_asked_before_waits_only_for_the_backoff() -> None:
    """The lease was over when the first question was asked; a later `updated_at` (the
    recorded unknown) must not restart it."""
    started = record("started", attempts=1, updated=200, deadline=30)
    assert next_attempt_at(started, POLICY) == at(202)


def test_a_call_that_used_up_its_attempts_is_left_to_an_operator() -> None:
    used_up = record(attempts=4)
    assert next_attempt_at(used_up, POLICY) is None
    assert not is_due(used_up, POLICY, at(10**6))
    assert exhausted(used_up, POLICY)
    assert not exhausted(record(attempts=3), POLICY)


@pytest.mark.parametrize(
    "status", ["completed", "failed", "awaiting_approval", "approved", "compensating"]
)
def test_only_unknown_calls_are_ever_due(status: CallStatus) -> None:
    assert next_attempt_at(record(status), POLICY) is None
    assert not exhausted(record(status, attempts=9), POLICY)


def test_a_policy_that_cannot_work_is_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        ReconcilePolicy(max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        ReconcilePolicy(backoff=timedelta(seconds=5), max_backoff=timedelta(seconds=1))
    with pytest.raises(ValueError, match="lease"):
        ReconcilePolicy(lease=timedelta(seconds=-1))


# --- the table of unsettled calls -----------------------------------------------------------


def fact(call: CallRecord | None, *, accepted: bool = True, offset: int = 1) -> Fact:
    key = call.key if call else "r1"
    return Fact(
        partition=1,
        offset=offset,
        verdict=Verdict(
            event_id=uuid.uuid4(),
            event_type="call_indeterminate",
            key=key,
            run_id=key.partition(":")[0],
            accepted=accepted,
            reason="accepted" if accepted else "late_outcome",
            detail="",
            call=call,
        ),
        event_json="{}",
    )


def test_an_unsettled_call_is_added_and_a_settled_one_removed() -> None:
    entry = fold_fact(None, fact(record(version=2)), partition=1)
    assert entry == UnsettledRun(partition=1, calls={"r1:c1": record(version=2)})
    other = fold_fact(entry, fact(record("started", key="r1:c2", version=1)), partition=1)
    assert other is not None and set(other.calls) == {"r1:c1", "r1:c2"}
    done = fold_fact(other, fact(record("completed", version=3)), partition=1)
    assert done is not None and set(done.calls) == {"r1:c2"}
    assert fold_fact(done, fact(record("failed", key="r1:c2", version=2)), partition=1) is None


def test_a_rejected_fact_changes_nothing() -> None:
    """The ledger did not change, so neither may the reconciler's picture of it."""
    entry = fold_fact(None, fact(record(version=2)), partition=1)
    rejected = fact(record("completed", version=3), accepted=False)
    assert fold_fact(entry, rejected, partition=1) is entry
    assert fold_fact(None, fact(None), partition=1) is None


def test_a_republished_older_fact_does_not_bring_back_an_old_version() -> None:
    """Facts are at least once: a repeat of version 2 after version 3 must not win."""
    entry = fold_fact(None, fact(record(attempts=1, version=3)), partition=1)
    assert fold_fact(entry, fact(record(version=2)), partition=1) is entry


def test_a_republished_suffix_of_facts_ends_where_it_ended_before() -> None:
    """A projector that takes over republishes facts in order; the repeat of the settling fact
    removes the call its repeated predecessor re-added."""
    facts = [fact(record(version=2)), fact(record("completed", version=3))]
    entry = None
    for f in [*facts, *facts]:
        entry = fold_fact(entry, f, partition=1)
    assert entry is None


def test_a_settled_call_not_in_the_table_leaves_no_entry() -> None:
    assert fold_fact(None, fact(record("completed", version=3)), partition=1) is None


def test_facts_round_trip_packed_or_single_and_garbage_is_not_a_fact() -> None:
    f, g = fact(record()), fact(record("completed", version=3))
    assert parse_facts(f.model_dump_json().encode()) == [f]
    packed = f"[{f.model_dump_json()},{g.model_dump_json()}]".encode()
    assert parse_facts(packed) == [f, g]
    assert parse_facts(b"\x00garbage") is None


# --- findings -------------------------------------------------------------------------------

shop = Toolset("shop")


async def _look(record: CallRecord, context: ToolContext) -> ReconcileOutcome:
    return ReconcileOutcome(status="unknown")


@shop.tool(external(), reconcile=_look)
async def refund(order: str, context: ToolContext) -> dict[str, int]:
    """Refund an order."""
    return {"cents": 2500}


def test_a_found_effect_becomes_a_reconcile_completion_with_the_real_result() -> None:
    call = record(version=5)
    found = ReconcileOutcome(status="completed", value={"cents": 2500}, result_reference="rf_1")
    finding = finding_for(call, refund, found, at(200))
    assert isinstance(finding, CallCompleted)
    assert (finding.source, finding.expected_version) == ("reconcile", 5)
    assert finding.reservation_id == call.reservation_id
    assert (finding.result_json, finding.result_reference) == ('{"cents":2500}', "rf_1")
    assert (finding.key, finding.tenant_id, finding.occurred_at) == ("r1:c1", "acme", at(200))


def test_no_effect_on_an_indeterminate_call_is_a_reconcile_failure() -> None:
    finding = finding_for(record(), refund, ReconcileOutcome("failed", detail="none"), at(200))
    assert isinstance(finding, CallFailed)
    assert (finding.source, finding.error, finding.expected_version) == ("reconcile", "none", 2)


def test_no_effect_on_a_started_call_inside_its_deadline_is_only_an_attempt() -> None:
    """The decider would reject `failed` while the runtime may still finish the call; the
    reconciler records an attempt instead and asks again later."""
    started = record("started", deadline=300)
    finding = finding_for(started, refund, ReconcileOutcome("failed"), at(200))
    assert isinstance(finding, ReconcileAttempted)
    assert "may still be running" in finding.detail
    late = finding_for(started, refund, ReconcileOutcome("failed"), at(306))
    assert isinstance(late, CallFailed)


def test_an_unknown_answer_is_the_next_numbered_attempt() -> None:
    call = record(attempts=2, version=7)
    finding = finding_for(call, refund, ReconcileOutcome("unknown", detail="no record"), at(9))
    assert isinstance(finding, ReconcileAttempted)
    assert (finding.attempt, finding.expected_version, finding.detail) == (3, 7, "no record")
    assert finding.reservation_id == call.reservation_id


def test_every_tool_and_toolset_of_a_module_is_collected() -> None:
    tools = collect_tools(["tests.integration.reconcile_tools"])
    assert set(tools) == {"recon.issue_credit", "recon.post_letter", "recon.wire_money"}
    assert tools["recon.issue_credit"] is reconcile_tools.issue_credit
    assert tools["recon.wire_money"].reconcile is None


# --- the driver's bookkeeping, on the in-memory ledger ----------------------------------------

asked: list[str] = []
desk = Toolset("desk")


async def _never_sure(record: CallRecord, context: ToolContext) -> ReconcileOutcome:
    asked.append(record.key)
    await asyncio.sleep(0.01)
    return ReconcileOutcome(status="unknown", detail="no idea")


@desk.tool(external(), reconcile=_never_sure)
async def stamp(form: str, context: ToolContext) -> str:
    """Stamp a form."""
    return form


async def _unknown_calls(stack: LedgerStack, n: int) -> list[CallRecord]:
    records = []
    for i in range(n):
        r = reserved(f"r{i}", "c1").model_copy(update={"tool": "desk.stamp"})
        for event in (r, indeterminate(r, t=5)):
            verdict = await stack.commands.append_and_await(event, timeout=5)
        assert verdict.call is not None
        records.append(verdict.call)
    return records


async def test_each_record_version_is_asked_about_once_however_often_it_is_scanned() -> None:
    """The table lags behind the ledger until the finding's fact comes back; scanning the same
    stale versions again must not ask again, even when the concurrency limit left some
    records for later scans."""
    asked.clear()
    stack = await LedgerStack.memory(partitions=2)
    try:
        records = await _unknown_calls(stack, 3)
        reconciler = Reconciler({"desk.stamp": stamp}, StackPort(stack), concurrency=1)
        for i in range(40):
            reconciler.scan(records if i % 2 else records[::-1])  # table order is not stable
            await asyncio.sleep(0.005)
        await until(lambda: reconciler.busy == 0, timeout=5, what="questions to finish")
        assert sorted(asked) == sorted(r.key for r in records)
        for r in records:
            now = await stack.store.get_call(r.key)
            assert now is not None and (now.reconcile_attempts, now.version) == (1, r.version + 1)
        fresh = [await stack.store.get_call(r.key) for r in records]
        assert reconciler.scan([f for f in fresh if f is not None]) == 0  # backoff: not yet due

        restarted = Reconciler(
            {"desk.stamp": stamp}, StackPort(stack), read_call=stack.store.get_call
        )
        restarted.scan(records)  # a table behind the ledger, as after a restart
        await until(lambda: restarted.busy == 0, timeout=5, what="the stale scan to finish")
        assert len(asked) == len(records), "a version the ledger left behind was asked about"
    finally:
        await stack.close()


def test_a_tools_module_that_declares_no_tool_is_refused() -> None:
    """A typo'd --tools module would otherwise start a reconciler that silently asks nobody."""
    with pytest.raises(ValueError, match="declares no Toolset or Tool"):
        collect_tools(["tests.builders"])
