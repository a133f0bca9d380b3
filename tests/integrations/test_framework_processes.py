"""Framework runs across real OS processes (Kafka + PostgreSQL): a process killed after its
tool took effect, resumed in a new process from the framework's own persistence, and two
processes resuming one thread at once. One effect in every case.

The persistence is each framework's: a LangGraph checkpointer (`FileSaver`, LangGraph's
`InMemorySaver` in a file), a PydanticAI message history saved at each `CallToolsNode`, an
OpenAI Agents `RunState` JSON (which the SDK offers only at an interruption, so its kill case
is a refund killed after its approval, resumed from the approval's state).
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import api_support as s
from tests.api_support import OneProcessSettings as Settings
from tests.fake_billing import FakeBilling
from tests.integration.procs import Proc, Procs, toolledger_env, until
from tests.isolated import Isolated, running_stack
from toolledger.testing import Operator
from toolledger.wiring.stack import LedgerStack


@pytest.fixture
def settings(isolated: Isolated) -> Settings:
    return s.api_settings(**isolated.connection())


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[LedgerStack]:
    """The projector runs here; the workers only append and read."""
    async with running_stack(settings) as stack:
        yield stack


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    procs = Procs(tmp_path)
    yield procs
    procs.close()


class Workers:
    def __init__(self, procs: Procs, settings: Settings, tmp: Path, framework: str) -> None:
        self.procs = procs
        self.tmp = tmp
        self.framework = framework
        self.env = toolledger_env(settings)
        self.store = tmp / "store"
        self.store.mkdir()
        self.billing = FakeBilling(tmp / "billing.db")

    def start(self, name: str, mode: str, tool: str, go: str = "", **env: str) -> Proc:
        return self.procs.python(
            name,
            "tests.integrations.worker",
            self.framework,
            mode,
            "--thread",
            "t1",
            "--store",
            str(self.store),
            "--tool",
            tool,
            "--service",
            str(self.tmp / "billing.db"),
            *(["--go", go] if go else []),
            env={**self.env, **env},
        )

    async def finished(self, proc: Proc) -> dict[str, Any]:
        code = await proc.wait_exit(timeout=60)
        assert code == 0, proc.output()
        return dict(json.loads((self.store / f"result-{proc.pid}.json").read_text()))


@pytest.mark.parametrize("framework", ["langgraph", "pydantic_ai"])
async def test_a_process_killed_after_the_credit_is_resumed_elsewhere_with_one_effect(
    framework: str, settings: Settings, stack: LedgerStack, procs: Procs, tmp_path: Path
) -> None:
    """A process SIGKILLed after the billing system made the credit, before anything recorded
    it, must not credit again when a new process resumes the run from the framework's saved
    state: the saved tool call id gives the same key, and the ledger answers it."""
    workers = Workers(procs, settings, tmp_path, framework)
    marker = tmp_path / "hung"
    first = workers.start(
        "first",
        "start",
        "billing__issue_credit_patiently",
        TEST_CREDIT_BEHAVIOUR="effect_then_hang",
        TEST_HANG_MARKER=str(marker),
    )
    await until(marker.exists, timeout=60, what="the credit made and the tool hanging")
    first.signal(signal.SIGKILL)
    await first.wait_exit(timeout=10)
    assert workers.billing.effects("t1:c1") == 1
    second = workers.start("second", "resume", "billing__issue_credit_patiently")
    result = await workers.finished(second)
    credit = await workers.billing.find_credit("t1:c1")
    assert credit is not None and credit.credit_id in result["step"]["answer"]
    assert (workers.billing.requests(), workers.billing.effects()) == (1, 1)


@pytest.mark.parametrize("framework", ["langgraph", "pydantic_ai", "openai_agents"])
async def test_two_processes_resuming_one_thread_make_one_effect(
    framework: str, settings: Settings, stack: LedgerStack, procs: Procs, tmp_path: Path
) -> None:
    """Two processes resuming one paused run (an approved refund) at the same instant must
    not both refund: one reservation wins, the other answers with its outcome."""
    workers = Workers(procs, settings, tmp_path, framework)
    paused = await workers.finished(workers.start("start", "start", "billing__refund_large"))
    assert paused["step"]["paused"] == ["t1:c1"]
    await approve(stack, settings, "t1:c1")
    go = tmp_path / "go"
    racers = [
        workers.start(f"racer{n}", "resume", "billing__refund_large", go=str(go)) for n in (1, 2)
    ]
    go.write_text("go")
    results = [await workers.finished(racer) for racer in racers]
    credit = await workers.billing.find_credit("t1:c1")
    assert credit is not None
    assert all(credit.credit_id in r["step"]["answer"] for r in results)
    assert (workers.billing.requests(), workers.billing.effects()) == (1, 1)


def operator(stack: LedgerStack) -> Operator:
    """An operator in process, signed with the key the projectors verify."""
    return Operator(stack, signing_key=s.SIGNING_KEY, tenant_id="acme", name="alice")


async def approve(stack: LedgerStack, settings: Settings, key: str) -> None:
    await operator(stack).approve(key, reason="looks right")


async def test_openai_agents_killed_after_an_approved_refund_resumes_from_its_run_state(
    settings: Settings, stack: LedgerStack, procs: Procs, tmp_path: Path
) -> None:
    """The OpenAI SDK saves a resumable `RunState` only at an interruption, so that is where its
    key becomes stable: a process that resumed an approved refund and was SIGKILLed after the
    refund took effect must not refund again when another process resumes the same state."""
    workers = Workers(procs, settings, tmp_path, "openai_agents")
    paused = await workers.finished(workers.start("start", "start", "billing__refund_large"))
    assert paused["step"]["paused"] == ["t1:c1"]
    await approve(stack, settings, "t1:c1")
    marker = tmp_path / "hung"
    doomed = workers.start(
        "doomed",
        "resume",
        "billing__refund_large",
        TEST_CREDIT_BEHAVIOUR="effect_then_hang",
        TEST_HANG_MARKER=str(marker),
    )
    await until(marker.exists, timeout=60, what="the refund made and the tool hanging")
    doomed.signal(signal.SIGKILL)
    await doomed.wait_exit(timeout=10)
    assert workers.billing.effects("t1:c1") == 1
    result = await workers.finished(workers.start("again", "resume", "billing__refund_large"))
    credit = await workers.billing.find_credit("t1:c1")
    assert credit is not None and credit.credit_id in result["step"]["answer"]
    assert (workers.billing.requests(), workers.billing.effects()) == (1, 1)


ERROR_TEXTS = ("Please try again", "Please fix your mistakes", "An error occurred", "Error:")


@pytest.mark.parametrize(
    "framework", ["langgraph", "langchain_agent", "pydantic_ai", "openai_agents"]
)
@pytest.mark.parametrize("wait", ["unknown", "approval"])
async def test_the_resumer_resumes_a_paused_framework_run_in_its_own_process(
    framework: str,
    wait: str,
    settings: Settings,
    stack: LedgerStack,
    procs: Procs,
    tmp_path: Path,
) -> None:
    """A framework run paused in one process (an unknown credit, or a refund awaiting
    approval) must go on by itself once an operator settles the call: `toolledger resumer`
    sees the run's recorded pause end and calls the documented hook, which resumes the run in
    the resumer's process. The model hears the truth and the billing system sees one effect."""
    workers = Workers(procs, settings, tmp_path, framework)
    tool = "billing__issue_credit_unreconciled" if wait == "unknown" else "billing__refund_large"
    behaviour = {"TEST_CREDIT_BEHAVIOUR": "effect_then_timeout"} if wait == "unknown" else {}
    resumer = procs.python(
        "resumer",
        "toolledger",
        "resumer",
        "--app",
        "tests.integrations.resume_hook:resume",
        env={
            **workers.env,
            "TEST_FRAMEWORK": framework,
            "TEST_STORE": str(workers.store),
            "TEST_TOOL": tool,
            "BILLING_DB": str(tmp_path / "billing.db"),
        },
    )
    paused = await workers.finished(workers.start("start", "start", tool, **behaviour))
    assert paused["step"]["paused"] == ["t1:c1"] and paused["heard"] == []
    run = await stack.store.get_run("t1")
    reason = "awaiting_reconciliation" if wait == "unknown" else "awaiting_approval"
    assert run is not None and (run.status, run.waiting_on) == (reason, "t1:c1")
    olivia = operator(stack)
    if wait == "unknown":
        credit = await workers.billing.find_credit("t1:c1")
        assert credit is not None, "the timed-out credit took effect"
        await olivia.resolve(
            "t1:c1", outcome="completed", value=credit.model_dump(), reason="in billing"
        )
    else:
        await olivia.approve("t1:c1", reason="the customer is right")
    log = workers.store / "resumed.jsonl"

    def resumed() -> bool:
        assert resumer.returncode is None, resumer.output()
        return log.exists() and log.read_text().endswith("\n")

    await until(resumed, timeout=60, what="the resumer's hook to resume t1")
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    credit = await workers.billing.find_credit("t1:c1")
    assert credit is not None and credit.credit_id in line["step"]["answer"]
    assert not any(t in told for told in line["heard"] for t in ERROR_TEXTS), line["heard"]
    assert (workers.billing.requests(), workers.billing.effects()) == (1, 1)

    # The resumer heard its run event's verdict from the leader's memory; this process reads
    # PostgreSQL, which holds it once the projection commits (a linger later at most).
    async def running_again() -> bool:
        run = await stack.store.get_run("t1")
        return run is not None and (run.status, run.waiting_on) == ("running", None)

    await until(running_again, timeout=15, what="the projection to hold t1 running again")
