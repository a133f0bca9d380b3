"""Pipelined reservation (issue 17), each promise on the memory ledger and on Kafka + PostgreSQL.

A pipelined tool runs once Kafka acknowledged its reservation, while the verdict is awaited
(`toolledger/runtime/pipelined.py`). The fake billing system honours idempotency keys and counts
every request and every effect: it is the judge of "reached twice, applied once".

`VerdictHold` stops the projector from deciding (its commits wait), which is what a runtime
sees when the projector is down: this is how a test makes a tool run before any verdict can
exist, deterministically and without sleeping. The races and the crashes need a second runtime:
on Kafka + PostgreSQL real OS processes (`tests/integration/pipelined_worker.py`), racing or
SIGKILLed by pid; on the memory ledger, which lives in one process, a second `Ledger` on the
same stack, cancelled where the process would be killed with its appends frozen, the closest an
in-process ledger can come (as in `tests/contract/test_runtime_scenarios.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.contract.runtime_harness import (
    ARGS,
    SIGNING_KEY,
    Clock,
    FrozenCommands,
    Harness,
    answer_of,
    kafka_settings,
    late_completed,
)
from tests.fake_billing import Credit, FakeBilling, use_service
from tests.integration.procs import Procs, until
from tests.pipelined_tools import (
    credit,
    credit_then_stall,
    credit_then_time_out,
    credit_unreconciled,
    stall,
)
from tests.tracing_support import Spans
from tests.verdict_hold import VerdictHold
from toolledger import (
    KeyConflictError,
    Ledger,
    LedgerUnavailable,
    RunQuarantined,
    RunSuperseded,
    TenantMismatchError,
    Tool,
    ToolCallContested,
    ToolCallIndeterminate,
)
from toolledger.devstack import start_tansu, stop_service
from toolledger.events.log import LogError, Position
from toolledger.events.models import (
    CallResolved,
    Event,
    RunCheckpointed,
    RunStarted,
)
from toolledger.wiring.commands import LedgerCommands
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

KEYS = 4


@pytest.fixture(autouse=True)
def _reset() -> None:
    stall.reset()


class _AcknowledgedOutcomes(LedgerCommands):
    """Commands that say when an outcome was acknowledged by the log."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.acknowledged = asyncio.Event()

    async def append(self, event: Event, timeout: float) -> Position:
        position = await super().append(event, timeout)
        if event.type in ("call_completed", "call_failed", "call_indeterminate"):
            self.acknowledged.set()
        return position


@dataclasses.dataclass
class Pipelined:
    """One test's harness, its verdict hold and the worker processes it may start."""

    h: Harness
    hold: VerdictHold
    procs: Procs

    @property
    def service(self) -> FakeBilling:
        return self.h.service

    async def bind(self) -> None:
        """The run's first call: verdict-first (nobody has bound the run yet), binding it."""
        await self.h.call(credit, "c0")

    async def both_sent(self, key: str) -> None:
        await until(lambda: self.service.requests(key) >= 2, timeout=20, what=f"2 requests {key}")

    async def sent(self, key: str) -> None:
        await until(lambda: self.service.requests(key) >= 1, timeout=20, what=f"a request {key}")


async def _history(p: Pipelined, key: str) -> list[tuple[str, str]]:
    return [(e.event_type, e.reason) for e in await p.h.stack.store.history(key)]


class PipelinedScenarios:
    """Every scenario, against whatever ledger the subclass's `p` fixture provides; the
    broker outage is the subclasses' own (`test_kafka_unavailable_before_the_ack_...`)."""

    async def race(self, p: Pipelined, keys: list[str]) -> list[dict[str, Any]]:
        """Two runtimes call every key at once, their verdicts held until both tools ran
        for every key; what each got, by tool_call_id (a credit id or an error name)."""
        raise NotImplementedError

    async def crash(self, p: Pipelined, at: str, tool: Tool[Any, Any]) -> None:
        """Another runtime makes the pipelined call r1:c1 and dies `at` tool|outcome|verdict
        (see `tests/integration/pipelined_worker.py`), verdicts held meanwhile."""
        raise NotImplementedError

    # -- the flow -------------------------------------------------------------------------------

    async def test_a_pipelined_tool_runs_before_its_verdict_and_records_one_outcome(
        self, p: Pipelined
    ) -> None:
        """The point of pipelining: the tool must not wait for the projector's round trip,
        and the call must still end with one recorded outcome."""
        await p.bind()
        p.hold.hold()
        task = asyncio.create_task(p.h.call(credit, "c1"))
        await p.sent("r1:c1")
        assert not task.done()
        p.hold.release()
        outcome = await asyncio.wait_for(task, 15)
        assert outcome.status == "completed" and not outcome.replayed
        record = await p.h.record("r1:c1", "completed")
        assert Credit.model_validate_json(record.result_json or "") == outcome.value
        assert await _history(p, "r1:c1") == [
            ("call_reserved", "accepted"),
            ("call_completed", "accepted"),
        ]
        assert p.service.requests("r1:c1") == 1 and p.service.effects("r1:c1") == 1

    async def test_a_runs_first_call_waits_for_its_verdict_before_the_tool_runs(
        self, p: Pipelined
    ) -> None:
        """Nothing but a verdict can say which tenant binds a new run: its first call must not
        run the tool before one (here none comes: the call is refused, not attempted)."""
        p.hold.hold()
        hasty = p.h.new_ledger(verdict_timeout=0.3)
        with pytest.raises(LedgerUnavailable, match="was not attempted"):
            await hasty.call(
                credit, run_id="r1", tool_call_id="c0", tenant_id="acme", arguments=ARGS
            )
        assert p.service.requests() == 0
        await hasty.close()

    async def test_with_the_projector_down_after_the_ack_the_call_waits_and_never_guesses(
        self, p: Pipelined, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Once the tool ran, a missing verdict must not become an answer, nor a refusal:
        the call waits past its verdict timeout, for as long as the projector is down."""
        await p.bind()
        patient = p.h.new_ledger(verdict_timeout=0.2)
        p.hold.hold()
        caplog.set_level(logging.WARNING, "toolledger.runtime")
        task = asyncio.create_task(
            patient.call(credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS)
        )
        await p.sent("r1:c1")
        waiting = "no verdict on the reservation of r1:c1"
        await until(lambda: caplog.text.count(waiting) >= 2, timeout=20, what="two warnings")
        assert not task.done()
        p.hold.release()
        outcome = await asyncio.wait_for(task, 15)
        assert outcome.status == "completed" and not outcome.replayed
        assert p.service.requests("r1:c1") == 1 and p.service.effects("r1:c1") == 1
        await patient.close()

    async def test_a_pipelined_calls_span_puts_the_verdict_on_its_outcome_phase(
        self, p: Pipelined, spans: Spans
    ) -> None:
        """The reserve phase ends on Kafka's acknowledgement; a trace that showed the verdict
        there would claim the tool waited for it."""
        await p.bind()
        await p.h.call(credit, "c1")
        call = next(
            s
            for s in spans.finished()
            if s.name == "execute_tool pipelined.credit"
            and (s.attributes or {}).get("gen_ai.tool.call.id") == "c1"
        )
        reserve, tool, outcome = spans.children(call)
        assert [reserve.name, tool.name, outcome.name] == [
            "toolledger.reserve",
            "toolledger.tool",
            "toolledger.outcome",
        ]
        assert "toolledger.verdict" not in (reserve.attributes or {})
        assert (outcome.attributes or {}).get("toolledger.verdict") == "accepted"

    # -- the rejections -------------------------------------------------------------------------

    async def test_racing_callers_reach_the_other_system_twice_make_one_effect_and_agree(
        self, p: Pipelined
    ) -> None:
        """Both callers' tools run before either verdict: the one whose reservation is held
        out must answer with the holder's outcome, which the deduped system made once."""
        await p.bind()
        keys = [f"k{n}" for n in range(1, KEYS + 1)]
        first, second = await self.race(p, keys)
        for k in keys:
            key = f"r1:{k}"
            record = await p.h.record(key, "completed")
            winner = Credit.model_validate_json(record.result_json or "")
            assert first[k] == second[k] == winner.credit_id, (k, first, second)
            assert p.service.requests(key) == 2 and p.service.effects(key) == 1
            history = await _history(p, key)
            reservations = [r for t, r in history if t == "call_reserved"]
            # The loser's reservation lands before the winner's outcome, or after it.
            assert reservations in (["accepted", "held"], ["accepted", "already_completed"])
            outcomes = sorted(r for t, r in history if t == "call_completed")
            assert outcomes[0] == "accepted" and len(outcomes) == 2, history
            assert outcomes[1] in ("not_current_reservation", "late_outcome"), history

    async def test_a_superseded_driver_stands_down_after_its_tool_ran(self, p: Pipelined) -> None:
        """A stale driver's pipelined tool may run before the verdict fences it out; it must
        stand down, and the driver that holds the run gets the same, single effect."""
        h = p.h
        env = {"key": "r1", "run_id": "r1", "tenant_id": "acme"}
        assert (await h.append(RunStarted(**env))).accepted
        assert (
            await h.append(RunCheckpointed(**env, expected_version=0, tool_call_ids=("c1",)))
        ).accepted
        assert (await h.call(credit, "c1", run_version=1)).status == "completed"
        later = RunCheckpointed(**env, expected_version=1, tool_call_ids=("c2",))
        assert (await h.append(later)).accepted
        with pytest.raises(RunSuperseded, match="ran before the ledger refused") as raised:
            await h.call(credit, "c2", run_version=1)
        assert "stand down" in str(raised.value) and raised.value.ran
        assert p.service.requests("r1:c2") == 1
        holder = await h.new_ledger().call(
            credit, run_id="r1", tool_call_id="c2", tenant_id="acme", arguments=ARGS, run_version=2
        )
        assert holder.status == "completed" and not holder.replayed
        assert holder.value == await p.service.find_credit("r1:c2")
        assert p.service.requests("r1:c2") == 2 and p.service.effects("r1:c2") == 1
        await h.record("r1:c2", "completed")
        history = await _history(p, "r1:c2")
        assert history[:2] == [
            ("call_reserved", "stale_driver"),
            ("call_completed", "unknown_call"),
        ]
        assert history[2:] == [("call_reserved", "accepted"), ("call_completed", "accepted")]

    # -- what is ruled out before the tool runs ---------------------------------------------------

    async def test_another_tenants_call_is_refused_before_the_tool_runs(self, p: Pipelined) -> None:
        """A run's tenant binding never changes, so a cached one rules another tenant out."""
        await p.bind()
        for ledger in (p.h.ledger, p.h.new_ledger()):
            with pytest.raises(TenantMismatchError):
                await ledger.call(
                    credit, run_id="r1", tool_call_id="c1", tenant_id="globex", arguments=ARGS
                )
        assert p.service.requests("r1:c1") == 0

    async def test_a_completed_key_and_other_arguments_are_answered_before_the_tool_runs(
        self, p: Pipelined
    ) -> None:
        """The fast path answers a pipelined call as any other: never a second request."""
        await p.bind()
        first = await p.h.call(credit, "c1")
        await p.h.record("r1:c1", "completed")
        again = await p.h.new_ledger().call(
            credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS
        )
        assert again.replayed and again.value == first.value
        with pytest.raises(KeyConflictError, match="the tool did not run"):
            await p.h.call(credit, "c1", arguments={**ARGS, "amount_cents": 1})
        assert p.service.requests("r1:c1") == 1

    async def test_a_contested_call_is_not_run_again(self, p: Pipelined) -> None:
        """A call an operator settled failed, then contradicted by a late completion, must not
        start a pipelined tool again."""
        h = p.h
        await p.bind()
        with pytest.raises(ToolCallIndeterminate):
            await h.call(credit_then_time_out, "c1")
        record = await h.record("r1:c1", "indeterminate")
        assert (await h.operator(CallResolved, record, outcome="failed")).accepted
        await late_completed(h)
        with pytest.raises(ToolCallContested):
            await h.call(credit_then_time_out, "c1")
        assert p.service.requests("r1:c1") == 1

    async def test_a_quarantined_run_is_refused_and_a_stale_cache_is_caught_by_the_verdict(
        self, p: Pipelined
    ) -> None:
        """A runtime that reads the quarantine refuses before sending; one whose cache predates
        it runs the tool, is told by the verdict, says so, and refuses the next call early."""
        h = p.h
        await p.bind()
        await h.stack.events.append("r1", b"\x00\x01 not avro at all")

        async def quarantined() -> bool:
            run = await h.stack.store.get_run("r1")
            return run is not None and run.quarantined

        await until(quarantined, timeout=15, what="r1 quarantined")
        with pytest.raises(RunQuarantined, match="was not made"):
            await h.new_ledger().call(
                credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS
            )
        assert p.service.requests("r1:c1") == 0
        with pytest.raises(RunQuarantined, match="ran before the ledger refused") as raised:
            await h.call(credit, "c1")
        assert raised.value.ran and p.service.requests("r1:c1") == 1
        with pytest.raises(RunQuarantined, match="was not made"):
            await h.call(credit, "c2")
        assert p.service.requests("r1:c2") == 0

    # -- crashes --------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("at", "tool"),
        [("tool", credit_then_stall), ("outcome", credit)],
        ids=["after the ack before the verdict", "after the tool before the outcome"],
    )
    async def test_killed_mid_call_the_replay_gets_the_hooks_result(
        self, p: Pipelined, at: str, tool: Tool[Any, Any]
    ) -> None:
        """The credit was made (the tool stalled after it, or returned and its outcome never
        left) and nothing else is known: the replay must find it, never credit again."""
        await p.bind()
        await self.crash(p, at, tool)
        await p.h.record("r1:c1", "started")
        outcome = await p.h.call(tool, "c1")
        assert outcome.replayed and outcome.settled_by == "reconcile"
        assert outcome.value == await p.service.find_credit("r1:c1")
        assert p.service.requests("r1:c1") == 1 and p.service.effects("r1:c1") == 1

    async def test_killed_after_the_outcome_before_the_verdict_the_replay_gets_the_result(
        self, p: Pipelined
    ) -> None:
        """The outcome was acknowledged before the caller heard its reservation's verdict:
        the replay must return that recorded result."""
        await p.bind()
        await self.crash(p, "verdict", credit)
        record = await p.h.record("r1:c1", "completed")
        assert record.settled_by == "runtime"
        outcome = await p.h.call(credit, "c1")
        assert outcome.replayed and outcome.value == await p.service.find_credit("r1:c1")
        assert p.service.requests("r1:c1") == 1 and p.service.effects("r1:c1") == 1

    async def test_without_a_hook_a_crashed_call_is_never_run_again(self, p: Pipelined) -> None:
        """No hook, no outcome: the replay can only say in progress, never run it again."""
        await p.bind()
        await self.crash(p, "outcome", credit_unreconciled)
        await p.h.record("r1:c1", "started")
        p.h.clock.advance(credit_unreconciled.budget + 10)
        with pytest.raises(ToolCallIndeterminate):
            await p.h.call(credit_unreconciled, "c1")
        assert p.service.requests("r1:c1") == 1


class TestMemoryPipelined(PipelinedScenarios):
    @pytest.fixture
    async def p(self, tmp_path: Path) -> AsyncIterator[Pipelined]:
        clock = Clock()
        service = use_service(FakeBilling(tmp_path / "billing.db"))
        ledger = await Ledger.memory(SIGNING_KEY, verdict_timeout=5, clock=clock)
        h = Harness(ledger, ledger.stack, service, clock, tmp_path)
        hold = VerdictHold(ledger.stack.store)
        yield Pipelined(h, hold, Procs(tmp_path))
        hold.release()
        await ledger.close()

    async def race(self, p: Pipelined, keys: list[str]) -> list[dict[str, Any]]:
        ledgers = [p.h.ledger, p.h.new_ledger()]
        p.hold.hold()

        async def calls(ledger: Ledger) -> dict[str, Any]:
            got = await asyncio.gather(
                *(
                    ledger.call(
                        credit, run_id="r1", tool_call_id=k, tenant_id="acme", arguments=ARGS
                    )
                    for k in keys
                ),
                return_exceptions=True,
            )
            return {k: answer_of(g) for k, g in zip(keys, got, strict=True)}

        racing = [asyncio.create_task(calls(ledger)) for ledger in ledgers]
        for k in keys:
            await p.both_sent(f"r1:{k}")
        p.hold.release()
        return list(await asyncio.wait_for(asyncio.gather(*racing), 20))

    async def crash(self, p: Pipelined, at: str, tool: Tool[Any, Any]) -> None:
        h = p.h
        commands: LedgerCommands = FrozenCommands(h.stack.events, h.stack.waiter)
        if at == "verdict":
            commands = _AcknowledgedOutcomes(h.stack.events, h.stack.waiter)
        stack = dataclasses.replace(h.stack, commands=commands, projector=None, _tasks=[])
        crashed = Ledger.from_stack(stack, clock=h.clock)
        p.hold.hold()
        task = asyncio.create_task(
            crashed.call(tool, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS)
        )
        if at == "tool":
            await asyncio.wait_for(stall.entered.wait(), 10)
        elif at == "outcome":
            assert isinstance(commands, FrozenCommands)
            await asyncio.wait_for(commands.frozen.wait(), 10)
        else:
            assert isinstance(commands, _AcknowledgedOutcomes)
            await asyncio.wait_for(commands.acknowledged.wait(), 10)
        if isinstance(commands, FrozenCommands):
            commands.kill()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await crashed.wait_background(1)
        p.hold.release()

    async def test_kafka_unavailable_before_the_ack_is_not_attempted(
        self, p: Pipelined, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No acknowledgement, no tool: the call is refused and its reservation abandoned.
        Here the memory log refuses every append while the outage lasts."""
        append = p.h.stack.events.append

        async def unreachable(key: str, value: bytes, headers: Any = ()) -> Position:
            raise LogError("broker unreachable (test outage)")

        await _not_attempted_while(
            p,
            down=lambda: monkeypatch.setattr(p.h.stack.events, "append", unreachable),
            up=lambda: monkeypatch.setattr(p.h.stack.events, "append", append),
        )

    async def test_a_caller_cancelled_mid_tool_leaves_no_verdict_watch_behind(
        self, p: Pipelined
    ) -> None:
        """A pipelined reservation's verdict is watched for from before its append; a caller
        that goes away before awaiting it must not leave the watch (and its waiter entry)."""
        await p.bind()
        task = asyncio.create_task(p.h.call(credit_then_stall, "c1"))
        await asyncio.wait_for(stall.entered.wait(), 10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        port = p.h.ledger.port
        assert isinstance(port, StackPort)
        assert port._watched == {}
        assert await p.h.ledger.wait_background(5)  # the cancelled call's outcome landed
        record = await p.h.record("r1:c1", "indeterminate")
        assert record.error == "cancelled while the tool was running"


class TestKafkaPostgresPipelined(PipelinedScenarios):
    @pytest.fixture
    async def p(
        self, tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str, topic_prefix: str
    ) -> AsyncIterator[Pipelined]:
        async with _kafka_harness(tmp_path, pg_dsn, pg_schema, kafka_bootstrap, topic_prefix) as p:
            yield p

    def _worker(self, p: Pipelined, name: str, *argv: str) -> Any:
        settings = p.h.settings
        assert settings is not None
        env = {
            "TOOLLEDGER_DATABASE_URL": settings.database_url or "",
            "TOOLLEDGER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap or "",
            "TOOLLEDGER_SCHEMA": settings.schema_name,
            "TOOLLEDGER_TOPIC_PREFIX": settings.topic_prefix,
            "TOOLLEDGER_PARTITIONS": str(settings.partitions),
        }
        ready = p.h.tmp / f"{name}.ready"
        service = str(p.service.path)
        worker = p.procs.python(
            name,
            "tests.integration.pipelined_worker",
            *argv,
            *("--service", service, "--ready", str(ready), "--go", str(p.h.tmp / "go")),
            env=env,
        )
        return worker, ready

    async def race(self, p: Pipelined, keys: list[str]) -> list[dict[str, Any]]:
        workers = [self._worker(p, f"racer{n}", "race", "--keys", str(len(keys))) for n in (1, 2)]
        for worker, ready in workers:
            await until(ready.exists, timeout=30, what=f"{worker.name} ready")
        p.hold.hold()
        (p.h.tmp / "go").write_text("go")
        for k in keys:
            await p.both_sent(f"r1:{k}")
        p.hold.release()
        answers = []
        for worker, _ in workers:
            assert await worker.wait_exit(timeout=30) == 0, worker.output()[-3000:]
            answers.append(json.loads(worker.output().strip().splitlines()[-1]))
        return answers

    async def crash(self, p: Pipelined, at: str, tool: Tool[Any, Any]) -> None:
        p.hold.hold()
        worker, ready = self._worker(p, f"crash-{at}", "crash", "--at", at, "--call", "c1")
        await until(ready.exists, timeout=30, what=f"the worker to reach {at}")
        worker.kill()
        assert worker.returncode == -9
        p.hold.release()

    async def test_kafka_unavailable_before_the_ack_is_not_attempted(
        self, tmp_path: Path, pg_dsn: str, pg_schema: str, topic_prefix: str
    ) -> None:
        """No acknowledgement, no tool: the call is refused and its reservation abandoned.
        Here the broker is this test's own, frozen (SIGSTOP): connected, answering nothing."""
        broker = start_tansu(tmp_path / "broker")
        pid = broker.pid
        assert pid is not None
        try:
            async with _kafka_harness(
                tmp_path, pg_dsn, pg_schema, broker.address, topic_prefix
            ) as own:
                await _not_attempted_while(
                    own,
                    down=lambda: os.kill(pid, signal.SIGSTOP),
                    up=lambda: os.kill(pid, signal.SIGCONT),
                )
        finally:
            os.kill(pid, signal.SIGCONT)
            stop_service(broker)


async def _not_attempted_while(
    p: Pipelined, *, down: Callable[[], object], up: Callable[[], object]
) -> None:
    """A pipelined call while Kafka does not acknowledge (`down` to `up`): refused before the
    tool, its reservation abandoned in the background, which lands once Kafka is back."""
    await p.bind()
    down()
    hasty = p.h.new_ledger(verdict_timeout=0.5)
    try:
        with pytest.raises(LedgerUnavailable, match="was not attempted"):
            await hasty.call(
                credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=ARGS
            )
        assert p.service.requests("r1:c1") == 0
    finally:
        up()
    assert await hasty.wait_background(20)

    async def tombstoned() -> bool:
        run = await p.h.stack.store.get_run("r1")
        return run is not None and len(run.abandoned) == 1

    await until(tombstoned, timeout=20, what="the abandoned reservation's tombstone")
    outcome = await p.h.call(credit, "c1")
    assert outcome.status == "completed" and p.service.requests("r1:c1") == 1
    await hasty.close()


@contextlib.asynccontextmanager
async def _kafka_harness(
    tmp_path: Path, pg_dsn: str, schema: str, bootstrap: str, prefix: str
) -> AsyncIterator[Pipelined]:
    clock = Clock()
    service = use_service(FakeBilling(tmp_path / "billing.db"))
    settings = kafka_settings(pg_dsn, bootstrap, schema, prefix)
    stack = await LedgerStack.connect(settings, run_projector=True)
    ledger = Ledger.from_stack(stack, verdict_timeout=5, clock=clock)
    hold = VerdictHold(stack.store)
    procs = Procs(tmp_path)
    try:
        yield Pipelined(Harness(ledger, stack, service, clock, tmp_path, settings), hold, procs)
    finally:
        procs.close()
        hold.release()
        await ledger.close()
        await stack.close()


del PipelinedScenarios
