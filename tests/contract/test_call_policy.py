"""One table of call-policy scenarios, through both surfaces, on both ledgers.

`AgentRun` (the run driver) and the framework adapters (`make_call`, under LangGraph, PydanticAI,
the OpenAI Agents SDK and MCP) once had two copies of the rules for twins, calls settled
elsewhere, approvals and the duplicate-intent guard, and the copies disagreed. Both now ask
`toolledger.runtime.policy`; this suite holds them to it. Each scenario is a list of steps
(the model asks a call, the same call is asked again after a pause, an operator acts), and each
surface must say the same thing at every step: what the model heard (status, and which call
answered it) or why the run stopped. The fake billing system counts the effects.

Every scenario runs on the memory ledger and on Kafka + PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.fake_billing import Credit, FakeBilling, service, use_service
from tests.forwarding_port import Forwarding
from tests.isolated import Isolated, running_ledger
from toolledger import Ledger, ProjectorSettings, ToolContext, Toolset, external
from toolledger.events.models import CallApproved, CallCompleted, CallRejected, CallResolved
from toolledger.events.signing import SigningKey, sign
from toolledger.integrations import AdapterOptions, CallKey, Pause, make_call
from toolledger.runtime.agents import AgentConfig, ToolPolicy
from toolledger.runtime.runs import AgentRun, ModelTurn, ToolCallRequest, Transcript

KEY_ID = "ops-1"
SIGNING_KEY = SigningKey.from_seed(KEY_ID, b"policy-tests-operator-signing-32")
ARGS = {"account_id": "acct-1", "amount_cents": 2500}
RUN = "r1"

policy_tools = Toolset("policy")
#: "hang": the credit is made, then the answer never comes back (the call is unknown).
behaviour = {"charge": "ok"}


@policy_tools.tool(external(), timeout=0.3)
async def charge(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A credit with no reconcile hook: an unknown one stays unknown until an operator acts."""
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        if behaviour["charge"] == "hang":
            await asyncio.sleep(30)
        return credit


@policy_tools.tool(external(approval=True))
async def refund(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A refund an operator must approve first."""
    async with context.sending():
        return await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


#: What a surface said at one step: the model heard (status, the call that answered it, when
#: another did), or the run stopped (why, and on which call it waits).
Said = tuple[Literal["heard"], str, str | None] | tuple[Literal["held"], str, str]


@dataclass(frozen=True)
class Ask:
    """The model asks for `call` (a new call); `again`: the same call asked after a pause."""

    call: str
    tool: str = "policy.charge"
    again: bool = False
    behaviour: str = "ok"


@dataclass(frozen=True)
class Act:
    """Someone other than the run acts on `call`."""

    action: Literal["resolve_completed", "resolve_failed", "late_completed", "approve", "reject"]
    call: str


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Ask | Act, ...]
    #: What every surface says at each `Ask`, in order.
    said: tuple[Said, ...]
    effects: int
    on_indeterminate: Literal["fail", "pause"] = "pause"


def k(call: str) -> str:
    return f"{RUN}:{call}"


SCENARIOS = [
    Scenario(
        "a repeat of an unsettled call is held",
        (Ask("c1", behaviour="hang"), Ask("c2")),
        (("heard", "indeterminate", None), ("held", "duplicate_intent", k("c1"))),
        effects=1,
        on_indeterminate="fail",
    ),
    Scenario(
        "a repeat of a call completed late hears its result",
        (
            Ask("c1", behaviour="hang"),
            Ask("c2"),
            Act("resolve_completed", "c1"),
            Ask("c2", again=True),
        ),
        (
            ("heard", "indeterminate", None),
            ("held", "duplicate_intent", k("c1")),
            ("heard", "completed", k("c1")),
        ),
        effects=1,
        on_indeterminate="fail",
    ),
    Scenario(
        "a call rejected by an operator stays rejected; its twin asks for its own approval",
        (
            Ask("c1", tool="policy.refund"),
            Act("reject", "c1"),
            Ask("c1", tool="policy.refund", again=True),
            Ask("c2", tool="policy.refund"),
        ),
        (
            ("held", "awaiting_approval", k("c1")),
            ("heard", "failed", None),
            ("held", "awaiting_approval", k("c2")),
        ),
        effects=0,
    ),
    Scenario(
        "an approval pending holds the call until it is approved, then it runs once",
        (
            Ask("c1", tool="policy.refund"),
            Ask("c1", tool="policy.refund", again=True),
            Act("approve", "c1"),
            Ask("c1", tool="policy.refund", again=True),
        ),
        (
            ("held", "awaiting_approval", k("c1")),
            ("held", "awaiting_approval", k("c1")),
            ("heard", "completed", None),
        ),
        effects=1,
    ),
    Scenario(
        "a call an operator settled failed is answered from its record, not run again",
        (Ask("c1", behaviour="hang"), Act("resolve_failed", "c1"), Ask("c1", again=True)),
        (("held", "awaiting_reconciliation", k("c1")), ("heard", "failed", None)),
        effects=1,
    ),
    Scenario(
        "a contested call stops the run again instead of being answered failed",
        (
            Ask("c1", behaviour="hang"),
            Act("resolve_failed", "c1"),
            Act("late_completed", "c1"),
            Ask("c1", again=True),
        ),
        (
            ("held", "awaiting_reconciliation", k("c1")),
            ("held", "awaiting_reconciliation", k("c1")),
        ),
        effects=1,
    ),
    Scenario(
        "a call asked again right after its own outcome reads its own write",
        (Ask("c1"), Ask("c1", again=True)),
        (("heard", "completed", None), ("heard", "completed", None)),
        effects=1,
    ),
]


class Surface(ABC):
    """One way a model's tool calls reach the ledger."""

    def __init__(self, ledger: Ledger, on_indeterminate: Literal["fail", "pause"]) -> None:
        self.ledger = ledger
        self.on_indeterminate = on_indeterminate

    @abstractmethod
    async def ask(self, step: Ask) -> Said: ...


class Adapters(Surface):
    """`make_call`, as every framework adapter makes a call; a pause is the framework's, and
    asking again is the framework resuming the same call."""

    async def ask(self, step: Ask) -> Said:
        tool = next(t for t in policy_tools if t.name == step.tool)
        options = AdapterOptions(on_indeterminate=self.on_indeterminate)
        said = await make_call(
            self.ledger,
            tool,
            CallKey(RUN, step.call),
            tenant_id="acme",
            arguments=ARGS,
            options=options,
        )
        if isinstance(said, Pause):
            return ("held", said.reason, said.waiting_on)
        return ("heard", said.status, said.same_as)


class _Idle(Exception):
    """The scripted model has nothing more to ask: the step is over."""


class Runs(Surface):
    """`AgentRun`, driven for real: each step is a fresh driver (another process) that starts or
    resumes the run; the model asks the step's call, then has nothing more to say."""

    def __init__(self, ledger: Ledger, on_indeterminate: Literal["fail", "pause"]) -> None:
        super().__init__(ledger, on_indeterminate)
        self.turns: list[ModelTurn] = []
        self.started = False

    async def model(self, transcript: Transcript) -> ModelTurn:
        if not self.turns:
            raise _Idle
        return self.turns.pop(0)

    async def ask(self, step: Ask) -> Said:
        if not step.again:
            self.turns.append([ToolCallRequest(step.call, step.tool, ARGS)])
        policy = ToolPolicy(on_indeterminate=self.on_indeterminate, on_error="return_to_model")
        run = AgentRun(
            self.ledger,
            run_id=RUN,
            tenant_id="acme",
            agent=AgentConfig(name="cashier", tool_policy=policy),
            tools=policy_tools,
            model=self.model,
        )
        try:
            if self.started:
                result = await run.resume()
            else:
                self.started = True
                result = await run.start("pay acct-1")
        except _Idle:
            told = [
                m
                for m in run.transcript
                if m.get("role") == "tool" and m["tool_call_id"] == step.call
            ]
            return ("heard", told[-1]["status"], told[-1].get("same_as"))
        assert result.waiting_on is not None, result
        return ("held", result.status, result.waiting_on)


async def act(ledger: Ledger, step: Act) -> None:
    """An operator's decision (signed, as the API signs), or a runtime's late outcome."""
    record = await ledger.read_call(k(step.call))
    assert record is not None
    who = {
        "key": record.key,
        "run_id": record.run_id,
        "tool_call_id": record.tool_call_id,
        "tenant_id": record.tenant_id,
    }
    decided = {"operator": "alice", "reason": "checked", "expected_version": record.version}
    event: Any
    match step.action:
        case "resolve_completed":
            credit = await service().find_credit(record.key)
            assert credit is not None
            value = credit.model_dump_json()
            event = sign(
                CallResolved(**who, **decided, outcome="completed", value_json=value), SIGNING_KEY
            )
        case "resolve_failed":
            event = sign(CallResolved(**who, **decided, outcome="failed"), SIGNING_KEY)
        case "approve":
            event = sign(CallApproved(**who, **decided), SIGNING_KEY)
        case "reject":
            event = sign(CallRejected(**who, **decided), SIGNING_KEY)
        case "late_completed":
            late = json.dumps({"late": True})
            event = CallCompleted(**who, reservation_id=record.reservation_id, result_json=late)
    verdict = await ledger.stack.commands.append_and_await(event, 10)
    expected = step.action != "late_completed"  # a late outcome is rejected, and contests
    assert verdict.accepted is expected, verdict.detail


class PolicyScenarios:
    @pytest.fixture(autouse=True)
    def _behaviour(self) -> None:
        behaviour["charge"] = "ok"

    @pytest.mark.parametrize("surface", [Adapters, Runs], ids=["adapters", "agent_run"])
    @pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
    async def test_every_surface_says_the_same(
        self, ledger: Ledger, billing: FakeBilling, surface: type[Surface], scenario: Scenario
    ) -> None:
        """What the model hears, or why the run stops, is the policy layer's answer whichever
        surface the call came through (the scenario's name says which rule it guards)."""
        driver = surface(ledger, scenario.on_indeterminate)
        said: list[Said] = []
        for step in scenario.steps:
            if isinstance(step, Act):
                await act(ledger, step)
                continue
            behaviour["charge"] = step.behaviour
            said.append(await driver.ask(step))
        assert tuple(said) == scenario.said
        assert billing.effects() == scenario.effects


class TestMemoryPolicy(PolicyScenarios):
    @pytest.fixture
    def billing(self, tmp_path: Path) -> FakeBilling:
        return use_service(FakeBilling(tmp_path / "billing.db"))

    @pytest.fixture
    async def ledger(self) -> AsyncIterator[Ledger]:
        ledger = await Ledger.memory(SIGNING_KEY, verdict_timeout=5)
        yield ledger
        await ledger.close()


class TestKafkaPostgresPolicy(PolicyScenarios):
    @pytest.fixture
    def billing(self, tmp_path: Path) -> FakeBilling:
        return use_service(FakeBilling(tmp_path / "billing.db"))

    @pytest.fixture
    async def ledger(self, isolated: Isolated) -> AsyncIterator[Ledger]:
        settings = isolated.settings(ProjectorSettings, verify_keys=SIGNING_KEY.verify_keys())
        async with running_ledger(settings, verdict_timeout=5) as ledger:
            yield ledger


del PolicyScenarios


@pytest.mark.parametrize("surface", [Adapters, Runs], ids=["adapters", "agent_run"])
async def test_a_call_reads_its_key_once(tmp_path: Path, surface: type[Surface]) -> None:
    """The policy layer reads the key and hands the record down the pipeline: a second read
    per call (the copies each read it, then `Ledger.call` read it again) is a round trip to
    PostgreSQL on every call of every run."""
    use_service(FakeBilling(tmp_path / "billing.db"))
    inner = await Ledger.memory(SIGNING_KEY, verdict_timeout=5)
    port = Forwarding(inner.port)
    ledger = Ledger(port, verdict_timeout=5)
    try:
        said = await surface(ledger, "pause").ask(Ask("c1"))
        assert said == ("heard", "completed", None)
        assert port.asked.count("read_call") == 1
    finally:
        await ledger.close()
        await inner.close()
