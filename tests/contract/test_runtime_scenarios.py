"""The runtime's promises, each shown on the memory ledger and on Kafka + PostgreSQL.

One suite (`RuntimeScenarios`) written once, run by `TestMemoryRuntime` on `Ledger.memory()`'s
stack and by `TestKafkaPostgresRuntime` on real services with a fresh schema and topic prefix per
test and an in-process projector. A fake billing system that honours idempotency keys and counts
every request and every effect (`tests/fake_billing.py`) is the judge of "one effect".

The four ways a tool runs twice (the seed article) are the tests named `test_way_1_...` to
`test_way_4_...`. Ways 2 and 3 need a second process: on Kafka + PostgreSQL it is a real OS
process (`tests/integration/crash_worker.py`), SIGKILLed or racing; on the memory ledger, which
lives in one process, it is a second `Ledger` on the same stack whose task is cancelled at the
same point, which is the closest an in-process ledger can come.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.contract.runtime_harness import (
    ARGS,
    FrozenCommands,
    Harness,
    answer_of,
    before_finding,
    calls,
    credit_found_late,
    credit_then_hang,
    credit_unreachable,
    credit_when_released,
    credit_with_expiring_token,
    declined_credit,
    flaky_lookup,
    gate,
    kafka_postgres_harness,
    large_credit,
    memory_harness,
    reset,
    slow_lookup,
    start_worker,
    wait_for_file,
)
from tests.fake_billing import (
    Credit,
    issue_credit,
    issue_credit_slowly,
    issue_credit_unreconciled,
)
from tests.fake_billing import (
    service as billing_service,
)
from tests.isolated import Isolated
from toolledger import (
    KeyConflictError,
    Ledger,
    RunSuperseded,
    TenantMismatchError,
    Tool,
    ToolCallAwaitingApproval,
    ToolCallError,
    ToolCallFailed,
    ToolCallIndeterminate,
    ToolCallInProgress,
)
from toolledger.events.log import Position
from toolledger.events.models import (
    CallApproved,
    CallIndeterminate,
    CallReserved,
    CallResolved,
    RunCheckpointed,
    RunStarted,
    args_digest,
    canonical_json,
)
from toolledger.events.records import CallRecord


class RuntimeScenarios:
    """Every scenario, against whatever ledger the subclass's `harness` fixture provides."""

    @pytest.fixture(autouse=True)
    def _reset(self) -> None:
        """Each scenario counts its own tool runs: a subclass in another module (the leader's)
        once counted the previous scenario's credit as a second run of its own."""
        reset()

    async def crash_after_tool(self, h: Harness, tool: Tool[Any, Any], call_id: str) -> None:
        """Make another runtime run `tool` for r1:`call_id` and die before recording it."""
        raise NotImplementedError

    async def race(self, h: Harness, tool: Tool[Any, Any], call_id: str) -> list[Any]:
        """Two runtimes call r1:`call_id` at once; what each got (outcome or error name)."""
        raise NotImplementedError

    # -- the four ways a tool runs twice -------------------------------------------------------

    async def test_way_1_a_write_that_times_out_is_indeterminate_and_not_retried(
        self, h: Harness
    ) -> None:
        """A framework that retries a timed-out write makes a second credit; we must not."""
        with pytest.raises(ToolCallIndeterminate) as raised:
            await h.call(credit_then_hang)
        assert calls["credit_then_hang"] == 1
        assert raised.value.record.status == "indeterminate"
        assert "toolledger executions resolve r1:c1 --outcome completed|failed" in str(raised.value)
        with pytest.raises(ToolCallIndeterminate):
            await h.call(credit_then_hang)
        assert calls["credit_then_hang"] == 1
        assert h.service.effects("r1:c1") == 1
        assert (await h.record("r1:c1")).status == "indeterminate"

    async def test_way_2_a_crashed_process_replay_gets_the_reconcile_hooks_result(
        self, h: Harness
    ) -> None:
        """A process killed after the credit and before recording it must not credit again."""
        await self.crash_after_tool(h, issue_credit, "c1")
        assert (await h.record("r1:c1")).status == "started"
        outcome = await h.call(issue_credit)
        assert outcome.status == "completed" and outcome.replayed
        assert outcome.settled_by == "reconcile"
        credit = await h.service.find_credit("r1:c1")
        assert isinstance(outcome.value, Credit) and outcome.value == credit
        assert outcome.result_reference == credit.credit_id
        assert h.service.requests("r1:c1") == 1 and h.service.effects("r1:c1") == 1
        again = await h.new_ledger().call(
            issue_credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS
        )
        assert again.value == credit and h.service.requests("r1:c1") == 1

    async def test_a_resend_gets_the_hooks_finding_though_its_own_late_outcome_landed_first(
        self, h: Harness
    ) -> None:
        """A caller that gave up mid-call leaves its runtime recording the call indeterminate in
        the background; resent at once, the key read `started`, its hook found the credit, and
        that background outcome landed before the finding, whose expected version was then
        stale: the resend answered unknown though the hook had found the credit."""
        reserved = CallReserved(
            key="r1:c1",
            run_id="r1",
            tool_call_id="c1",
            tenant_id="acme",
            tool=credit_found_late.name,
            effect="external",
            args_digest=args_digest(ARGS),
            arguments_json=canonical_json(ARGS),
            deadline=h.clock() + timedelta(minutes=5),
        )
        assert (await h.append(reserved)).accepted
        credit = await billing_service().credit("acct-1", 2500, idempotency_key="r1:c1")

        async def the_given_up_attempt_lands(record: CallRecord) -> None:
            assert record.status == "started"
            late = CallIndeterminate(
                key=record.key,
                run_id=record.run_id,
                tool_call_id=record.tool_call_id,
                tenant_id=record.tenant_id,
                occurred_at=h.clock(),
                reservation_id=reserved.reservation_id,
                error="cancelled while the tool was running",
                error_type="Cancelled",
            )
            assert (await h.append(late)).accepted

        before_finding["run"] = the_given_up_attempt_lands
        outcome = await h.call(credit_found_late)
        assert outcome.status == "completed" and outcome.settled_by == "reconcile"
        assert outcome.value == credit
        assert calls["credit_found_late"] == 0 and h.service.effects("r1:c1") == 1

    async def test_way_2_a_crashed_process_replay_without_hook_never_runs_it_again(
        self, h: Harness
    ) -> None:
        """Without a hook the replay can only say "in progress", then "unknown": never rerun."""
        await self.crash_after_tool(h, issue_credit_unreconciled, "c1")
        with pytest.raises(ToolCallInProgress):
            await h.call(issue_credit_unreconciled)
        h.clock.advance(issue_credit_unreconciled.budget + 10)
        with pytest.raises(ToolCallIndeterminate) as raised:
            await h.call(issue_credit_unreconciled)
        assert "toolledger executions resolve r1:c1" in str(raised.value)
        assert h.service.requests("r1:c1") == 1 and h.service.effects("r1:c1") == 1

    async def test_way_3_two_runtimes_calling_one_key_at_once_give_one_effect(
        self, h: Harness
    ) -> None:
        """Two processes driving one run must not both credit the customer."""
        got = await self.race(h, issue_credit_slowly, "c1")
        record = await h.record("r1:c1", "completed")
        winner = Credit.model_validate_json(record.result_json or "null")
        assert h.service.requests("r1:c1") == 1 and h.service.effects("r1:c1") == 1
        assert all(g in (winner.credit_id, "ToolCallInProgress") for g in got), got
        assert winner.credit_id in got
        reservations = [
            e.reason
            for e in await h.stack.store.history("r1:c1")
            if e.event_type == "call_reserved"
        ]
        assert reservations.count("accepted") == 1, reservations

    async def test_way_4_a_new_tool_call_id_is_a_new_key(self, h: Harness) -> None:
        """Documented, not prevented here: the model calling again is a new call and a second
        effect (the runs issue adds the duplicate-intent guard)."""
        first = await h.call(issue_credit, "c1")
        second = await h.call(issue_credit, "c2")
        assert first.value != second.value
        assert h.service.effects() == 2

    # -- retry rules and classification ---------------------------------------------------------

    async def test_a_read_that_fails_twice_then_succeeds_runs_three_times(self, h: Harness) -> None:
        """Reads are retried: a flaky lookup must not fail the run."""
        outcome = await h.call(flaky_lookup, arguments={"order_id": "o-9"})
        assert outcome.result() == "order o-9 shipped"
        assert calls["flaky_lookup"] == 3
        assert (await h.record("r1:c1", "completed")).result_json == '"order o-9 shipped"'

    async def test_a_read_timeout_is_retried(self, h: Harness) -> None:
        """A read that times out is simply asked again."""
        outcome = await h.call(slow_lookup, arguments={"order_id": "o-1"})
        assert outcome.result() == "o-1" and calls["slow_lookup"] == 2

    async def test_a_write_not_attempted_is_failed_and_runs_again(self, h: Harness) -> None:
        """A refusal before sending is not an unknown: the next call must run it."""
        first = await h.call(credit_with_expiring_token)
        assert first.status == "failed" and first.not_attempted
        with pytest.raises(ToolCallFailed, match="Nothing was sent"):
            first.result()
        assert (await h.record("r1:c1", "failed")).not_attempted
        second = await h.call(credit_with_expiring_token)
        assert second.status == "completed" and not second.replayed
        assert calls["credit_with_expiring_token"] == 2 and h.service.effects("r1:c1") == 1

    async def test_an_error_before_sending_is_not_attempted(self, h: Harness) -> None:
        """A connection refused before `sending()` cannot have reached billing."""
        outcome = await h.call(credit_unreachable)
        assert outcome.status == "failed" and outcome.not_attempted
        assert "ConnectionRefusedError" in (outcome.error or "")

    async def test_a_definite_refusal_is_failed_not_unknown(self, h: Harness) -> None:
        """`ToolFailedError` means the other system said no: failed, not indeterminate."""
        outcome = await h.call(declined_credit)
        assert outcome.status == "failed" and not outcome.not_attempted
        assert (await h.record("r1:c1", "failed")).error == outcome.error

    # -- the ledger's answers -------------------------------------------------------------------

    async def test_key_conflict_on_different_arguments_does_not_run_the_tool(
        self, h: Harness
    ) -> None:
        """The same call id with other arguments is a bug in the caller, never a second credit."""
        await h.call(issue_credit)
        with pytest.raises(KeyConflictError, match="a new call needs a new tool_call_id"):
            await h.call(issue_credit, arguments={**ARGS, "amount_cents": 9900})
        assert h.service.requests() == 1

    async def test_the_fast_path_returns_the_recorded_result_without_kafka(
        self, h: Harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Replaying a completed call must neither run the tool nor append anything."""
        first = await h.call(issue_credit)
        await h.record("r1:c1", "completed")
        appended: list[str] = []
        original = h.stack.events.append

        async def counting(key: str, value: bytes, headers: Any = ()) -> Position:
            appended.append(key)
            return await original(key, value, headers)

        monkeypatch.setattr(h.stack.events, "append", counting)
        again = await h.call(
            issue_credit, arguments={"amount_cents": "2500", "account_id": "acct-1"}
        )
        assert again.replayed and again.value == first.value
        assert appended == [] and h.service.requests() == 1

    async def test_a_result_is_restored_to_its_declared_type_on_replay(self, h: Harness) -> None:
        """A replayed call must hand back a Credit, not the dict it was stored as."""
        first = await h.call(issue_credit)
        await h.record("r1:c1", "completed")
        async with h.new_ledger() as fresh:
            again = await fresh.call(
                issue_credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS
            )
        assert isinstance(again.value, Credit) and again.value == first.value and again.replayed

    async def test_a_late_completion_after_an_operator_resolved_gets_the_operators_truth(
        self, h: Harness
    ) -> None:
        """A late completion after an operator resolved the call must not overwrite it."""
        task = asyncio.create_task(h.call(credit_when_released))
        record = await h.record("r1:c1", "started")
        h.clock.advance(credit_when_released.budget + 10)
        found = Credit(credit_id="cr_found_by_alice", account_id="acct-1", amount_cents=2500)
        verdict = await h.operator(
            CallResolved, record, outcome="completed", value_json=found.model_dump_json()
        )
        assert verdict.accepted, verdict.detail
        gate["release"].set()
        outcome = await asyncio.wait_for(task, 15)
        assert outcome.status == "completed" and outcome.settled_by == "operator"
        assert outcome.value == found and not outcome.replayed
        history = await h.stack.store.history("r1:c1")
        assert [(e.event_type, e.reason) for e in history][-1] == ("call_completed", "late_outcome")

    async def test_a_call_needing_approval_runs_only_after_an_operator_approves(
        self, h: Harness
    ) -> None:
        """An approval-gated credit must not run before a person says yes."""
        with pytest.raises(ToolCallAwaitingApproval):
            await h.call(large_credit)
        with pytest.raises(ToolCallAwaitingApproval):
            await h.call(large_credit)
        assert calls["large_credit"] == 0
        record = await h.record("r1:c1", "awaiting_approval")
        assert (await h.operator(CallApproved, record)).accepted
        outcome = await h.call(large_credit)
        assert outcome.status == "completed" and calls["large_credit"] == 1

    async def test_a_superseded_driver_stands_down(self, h: Harness) -> None:
        """A driver holding an old checkpoint must not reserve calls."""
        env = {"key": "r1", "run_id": "r1", "tenant_id": "acme"}
        assert (await h.append(RunStarted(**env))).accepted
        checkpoint = RunCheckpointed(**env, expected_version=0, tool_call_ids=("c1",))
        assert (await h.append(checkpoint)).accepted
        with pytest.raises(RunSuperseded, match="must stand down"):
            await h.call(issue_credit, run_version=0)
        assert h.service.requests() == 0
        outcome = await h.call(issue_credit, run_version=1)
        assert outcome.status == "completed"

    async def test_another_tenants_run_is_refused(self, h: Harness) -> None:
        """A run's first event binds its tenant; another tenant cannot call into it."""
        await h.call(issue_credit, "c1")
        with pytest.raises(TenantMismatchError) as raised:
            await h.call(issue_credit, "c2", tenant_id="globex")
        assert isinstance(raised.value, PermissionError) and h.service.requests() == 1


class TestMemoryRuntime(RuntimeScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[Harness]:
        async with memory_harness(tmp_path) as h:
            yield h

    async def crash_after_tool(self, h: Harness, tool: Tool[Any, Any], call_id: str) -> None:
        commands = FrozenCommands(h.stack.events, h.stack.waiter)
        stack = dataclasses.replace(h.stack, commands=commands, projector=None, _tasks=[])
        crashed = Ledger.from_stack(stack, clock=h.clock)
        task = asyncio.create_task(
            crashed.call(tool, run_id="r1", tool_call_id=call_id, tenant_id="acme", arguments=ARGS)
        )
        await asyncio.wait_for(commands.frozen.wait(), 10)
        commands.kill()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await crashed.wait_background(1)

    async def race(self, h: Harness, tool: Tool[Any, Any], call_id: str) -> list[Any]:
        ledgers = [h.ledger, h.new_ledger()]
        got = await asyncio.gather(
            *(
                lg.call(tool, run_id="r1", tool_call_id=call_id, tenant_id="acme", arguments=ARGS)
                for lg in ledgers
            ),
            return_exceptions=True,
        )
        return [answer_of(g) for g in got]


class TestKafkaPostgresRuntime(RuntimeScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
        async with kafka_postgres_harness(tmp_path, isolated) as h:
            yield h

    async def crash_after_tool(self, h: Harness, tool: Tool[Any, Any], call_id: str) -> None:
        proc, ready, _go = await start_worker(h, "crash", tool, call_id)
        try:
            await wait_for_file(ready, proc)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
        assert proc.returncode == -signal.SIGKILL

    async def race(self, h: Harness, tool: Tool[Any, Any], call_id: str) -> list[Any]:
        proc, ready, go = await start_worker(h, "race", tool, call_id)
        try:
            await wait_for_file(ready, proc)
            go.write_text("go")
            try:
                mine = answer_of(await h.call(tool, call_id))
            except ToolCallError as exc:
                mine = answer_of(exc)
            out, err = await asyncio.wait_for(proc.communicate(), 15)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()[-2000:]
        theirs = json.loads(out.decode().strip().splitlines()[-1])
        return [mine, theirs.get("credit_id") or theirs["error"]]


del RuntimeScenarios
