"""`toolledger server` on the real Kafka broker and PostgreSQL: every server role, one command.

The server is one OS process (started and stopped by pid through `tests.integration.procs`)
that projects, serves the operator API with its console, and supervises the reconciler and the
resumer as its children. The test process plays only a runtime (no projector of its own) and
an operator with an HTTP client, so every verdict here was reached by the server.
"""

from __future__ import annotations

import re
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from tests import api_support as s
from tests import builders as b
from tests import run_tools
from tests.fake_billing import FakeBilling, use_service
from tests.integration.procs import Proc, Procs, toolledger_env, until
from tests.integration.reconcile_tools import BILLING_ENV
from tests.isolated import Isolated
from tests.run_tools import ARGS, ScriptedModel, runs_billing
from toolledger import Ledger
from toolledger.api.app import close_stack
from toolledger.api.tokens import PostgresTokens
from toolledger.errors import ExitStatus
from toolledger.events.models import (
    CallIndeterminate,
    CallReserved,
    args_digest,
    call_key,
    canonical_json,
    utcnow,
)
from toolledger.events.signing import SigningKey, sign
from toolledger.runtime.agents import AgentConfig, ToolPolicy
from toolledger.runtime.runs import AgentRun, ToolCallRequest
from toolledger.settings import Settings
from toolledger.wiring.stack import LedgerStack

#: Import, connect, create topics, take partitions, join the processors' groups.
START_TIMEOUT = 40.0
#: A fact reaching a processor (up to 1.5 s per fetch against tansu) and its action landing.
ACT_TIMEOUT = 45.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    proc: Proc
    base: str
    settings: Settings
    billing_path: Path
    resume_log: Path


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    procs = Procs(tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def _env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    return {
        **toolledger_env(settings),
        "TOOLLEDGER_VERIFY_KEYS": s.SIGNING_KEY.public_setting(),
        "TOOLLEDGER_SIGNING_KEYS": s.SIGNING_KEY.setting(),
        "TOOLLEDGER_METRICS_TOKEN": s.METRICS_TOKEN,
        BILLING_ENV: str(tmp_path / "billing.sqlite"),
        "BILLING_DB": str(tmp_path / "billing.sqlite"),
        "RESUME_LOG": str(tmp_path / "resumed.log"),
    }


def start_server(procs: Procs, settings: Settings, tmp_path: Path, name: str = "server") -> Server:
    port = _free_port()
    proc = procs.python(
        name,
        "toolledger",
        "server",
        "--port",
        str(port),
        "--tools",
        "tests.integration.reconcile_tools",
        "--resume-app",
        "tests.integration.resume_hook:resume",
        "--status-every",
        "0.2",
        env=_env(settings, tmp_path),
    )
    return Server(
        proc, f"http://127.0.0.1:{port}", settings, tmp_path / "billing.sqlite",
        tmp_path / "resumed.log",
    )  # fmt: skip


@pytest.fixture
async def server(isolated: Isolated, procs: Procs, tmp_path: Path) -> Server:
    settings = isolated.settings(Settings)
    started = start_server(procs, settings, tmp_path)
    await started.proc.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT)
    await started.proc.wait_for(r"owns facts partitions \[0, 1\]", timeout=START_TIMEOUT)
    return started


@pytest.fixture
async def runtime(server: Server) -> AsyncIterator[Ledger]:
    """A runtime's ledger on the server's schema and topics; it projects nothing itself."""
    stack = await LedgerStack.connect(server.settings, create_topics=False)
    ledger = Ledger.from_stack(stack, verdict_timeout=10)
    try:
        yield ledger
    finally:
        await ledger.close()
        await close_stack(stack)


async def _operator(server: Server) -> httpx.AsyncClient:
    settings = server.settings
    assert settings.database_url is not None
    tokens = PostgresTokens(settings.database_url, settings.schema_name)
    try:
        bearer = await s.token(tokens, ttl=timedelta(minutes=10))
    finally:
        await tokens.close()
    return httpx.AsyncClient(base_url=server.base, headers={"Authorization": f"Bearer {bearer}"})


async def _lost_credit(ledger: Ledger, billing: FakeBilling) -> str:
    """A recon.issue_credit call whose credit was made but whose answer was lost."""
    key = call_key("recon-1", "c1")
    reserved = CallReserved(
        key=key,
        run_id="recon-1",
        tool_call_id="c1",
        tenant_id="acme",
        tool="recon.issue_credit",
        effect="external",
        args_digest=args_digest({"account_id": "a-7", "amount_cents": 2500}),
        arguments_json=canonical_json({"account_id": "a-7", "amount_cents": 2500}),
        deadline=utcnow() + timedelta(seconds=1),
    )
    commands = ledger.stack.commands
    assert (await commands.append_and_await(reserved, timeout=10)).accepted
    await billing.credit("a-7", 2500, idempotency_key=key)
    lost = CallIndeterminate(
        key=key,
        run_id="recon-1",
        tool_call_id="c1",
        tenant_id="acme",
        reservation_id=reserved.reservation_id,
        error="TimeoutError: no answer after the request left",
    )
    assert (await commands.append_and_await(lost, timeout=10)).accepted
    return key


async def test_one_server_process_projects_serves_the_console_reconciles_and_resumes(
    server: Server, runtime: Ledger
) -> None:
    """Done-when of issue 26: with only `toolledger server` running the server side, an
    operator resolves an unknown call through the API the console is served with, the resumer
    then resumes the run that waited on it, and the reconciler settles another unknown call
    with its hook. A role missing from the one command would leave one of these waiting."""
    billing = use_service(FakeBilling(server.billing_path))
    run_tools.behaviour["charge"] = "effect_then_timeout"
    try:
        paused = await AgentRun(
            runtime,
            run_id="r1",
            tenant_id="acme",
            agent=AgentConfig(
                name="billing-assistant", tool_policy=ToolPolicy(on_indeterminate="pause")
            ),
            tools=runs_billing,
            model=ScriptedModel([ToolCallRequest("c1", "runs.charge", ARGS)]),
        ).start("charge me")
    finally:
        run_tools.behaviour["charge"] = "ok"
    assert (paused.status, paused.waiting_on) == ("awaiting_reconciliation", "r1:c1")
    reconciled = await _lost_credit(runtime, billing)

    async with await _operator(server) as web:
        assert (await web.get("/readyz")).status_code == 200
        assert (await web.get("/console/signin")).status_code == 200
        got = await web.post(
            "/v1/tool-executions/r1:c1/resolve",
            json={"outcome": "completed", "reason": "found in billing", "value": {"ok": True}},
        )
        assert got.status_code == 200, got.text
        assert (got.json()["status"], got.json()["operator"]) == ("completed", "alice")

    async def resumed() -> str | None:
        return server.resume_log.read_text() if server.resume_log.exists() else None

    assert (await until(resumed, timeout=ACT_TIMEOUT, what="the resumer")).split() == [
        "r1", "completed", "completed",
    ]  # fmt: skip

    async def completed() -> bool:
        # The resumer's process heard its leader answer; PostgreSQL has it a batch later.
        run = await runtime.stack.store.get_run("r1")
        return run is not None and run.status == "completed"

    await until(completed, timeout=ACT_TIMEOUT, what="the resumed run's completion committed")

    async def settled() -> bool:
        record = await runtime.read_call(reconciled)
        return record is not None and record.status == "completed"

    await until(settled, timeout=ACT_TIMEOUT, what="the reconciler to settle recon-1:c1")
    history = await runtime.stack.store.history(reconciled)
    assert any('"source":"reconcile"' in h.event_json for h in history if h.accepted)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by init counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def _children(server: Server) -> list[int]:
    pids = re.findall(r"started the \w+ \(pid (\d+)\)", server.proc.output())
    assert len(pids) == 2, server.proc.output()[-3000:]
    return [int(pid) for pid in pids]


async def test_a_sigkilled_server_leaves_no_child_role_running(server: Server) -> None:
    """A reconciler outlived its SIGKILLed server for an hour in this very suite (a faust
    worker told to stop while starting hung): the kernel must kill the children with it."""
    children = _children(server)
    server.proc.kill()
    await until(lambda: all(_gone(pid) for pid in children), timeout=10, what=f"{children} to die")


async def test_sigterm_stops_every_role_by_pid_and_the_server_exits_0(server: Server) -> None:
    """SIGTERM to the server's pid must stop its children too: a supervisor that exits and
    leaves a reconciler or resumer running would keep consuming facts nobody deploys."""
    children = _children(server)
    server.proc.signal(signal.SIGTERM)
    assert await server.proc.wait_exit(timeout=60) == ExitStatus.OK, server.proc.output()[-3000:]

    await until(lambda: all(_gone(pid) for pid in children), timeout=10, what=f"{children} to exit")


async def test_a_child_role_that_stops_stops_the_server_with_its_exit_status(
    isolated: Isolated, procs: Procs, tmp_path: Path
) -> None:
    """A resumer that stops on its own (status 3: what it needed did not answer); the server
    must not run on without it, and must exit 3 as the resumer did, naming the role."""
    settings = isolated.settings(Settings)
    env = _env(settings, tmp_path)
    port = _free_port()
    proc = procs.python(
        "server", "toolledger", "server", "--port", str(port),
        "--resume-app", "tests.integration.resume_hook_stops:resume", env=env,
    )  # fmt: skip
    assert await proc.wait_exit(timeout=60) == ExitStatus.UNAVAILABLE, proc.output()[-3000:]
    assert re.search(r"the resumer \(pid \d+\) exited with status 3", proc.output())


async def test_bad_settings_stop_the_server_before_anything_starts_naming_the_setting(
    isolated: Isolated, procs: Procs, tmp_path: Path
) -> None:
    """Without the signing key the API cannot sign; the server must say which setting is
    missing and start no role (no child, no topic) rather than run without an API."""
    settings = isolated.settings(Settings)
    env = {**_env(settings, tmp_path), "TOOLLEDGER_SIGNING_KEYS": ""}
    proc = procs.python("server", "toolledger", "server", "--port", str(_free_port()), env=env)
    assert await proc.wait_exit(timeout=60) == ExitStatus.USAGE
    assert "TOOLLEDGER_SIGNING_KEYS" in proc.output()
    assert "started the" not in proc.output()


async def test_a_port_in_use_is_a_usage_error_naming_the_port(
    isolated: Isolated, procs: Procs, tmp_path: Path
) -> None:
    """A taken port must stop startup with exit 2 and the port named, before any role runs."""
    settings = isolated.settings(Settings)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = procs.python(
            "server", "toolledger", "server", "--port", str(port), env=_env(settings, tmp_path)
        )
        assert await proc.wait_exit(timeout=60) == ExitStatus.USAGE
    assert f"cannot listen on 127.0.0.1:{port}" in proc.output()


async def test_a_halted_partition_shows_in_the_status_line_readyz_metrics_and_console(
    server: Server, runtime: Ledger
) -> None:
    """Issue 26, item 5, on the real services: an operator event signed with a key id the
    server's projector lacks halts its partition. The one ERROR line used to be all there was
    (`/readyz` stayed 200); the status line, `/readyz`, the gauge and the console's banner must
    each name the partition, the offset and the key to deploy."""
    unknown = SigningKey.from_seed("ops-unknown", b"a key no projector was given 32b")
    r = b.reserved("halting", "c1", timeout=10)
    commands = runtime.stack.commands
    for event in (r, b.indeterminate(r, t=1)):
        assert (await commands.append_and_await(event, 10)).accepted
    position = await commands.append(sign(b.resolved(r, 2, t=120, signed=False), unknown), 10)
    where = f"partition {position.partition} at offset {position.offset}"
    await server.proc.wait_for(f"HALTED {where}: .*ops-unknown", timeout=ACT_TIMEOUT)

    async with await _operator(server) as web:
        ready = await web.get("/readyz")
        assert ready.status_code == 503
        message = ready.json()["error"]["message"]
        assert f"partition {position.partition} is halted at offset {position.offset}" in message
        assert "ops-unknown" in message and "TOOLLEDGER_VERIFY_KEYS" in message
        metrics = (await web.get("/metrics", headers=s.METRICS_AUTH)).text
        gauge = f'toolledger_projector_partition_halted{{partition="{position.partition}"}} 1.0'
        assert gauge in metrics
        assert "toolledger_projector_partition_lag_records" in metrics

        page = await web.get("/console/signin")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert csrf is not None
        bearer = web.headers["Authorization"].removeprefix("Bearer ")
        await web.post("/console/signin", data={"csrf_token": csrf.group(1), "token": bearer})
        queue = await web.get("/console/queue")
        assert 'class="banner"' in queue.text
        assert f"partition {position.partition} is halted at offset {position.offset}" in queue.text


async def test_two_servers_share_the_partitions_and_one_takes_over_when_the_other_dies(
    isolated: Isolated, procs: Procs, tmp_path: Path
) -> None:
    """Several servers share partitions as projectors do: with shared ownership each of two
    takes one, and when one is SIGKILLed the survivor folds both within seconds."""
    settings = isolated.settings(Settings)
    env = {**_env(settings, tmp_path), "TOOLLEDGER_PROJECTOR_OWNERSHIP": "share"}
    fast = ("--status-every", "0.2")
    one, two = [
        procs.python(name, "toolledger", "server", "--port", str(_free_port()), *fast, env=env)
        for name in ("server-1", "server-2")
    ]
    shares = [await proc.wait_for(r"owns \[(\d)\];", timeout=START_TIMEOUT) for proc in (one, two)]
    assert {m.group(1) for m in shares} == {"0", "1"}
    one.kill()
    await two.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT, after=two.mark())


@pytest.mark.parametrize(
    "spec",
    [
        "tests.integration.resume_hook",
        "tests.integration.no_such_module:resume",
        "tests.integration.resume_hook:no_such_function",
    ],
    ids=["no-function", "no-module", "no-attribute"],
)
async def test_a_resume_app_that_cannot_load_stops_the_server_before_anything_starts(
    isolated: Isolated, procs: Procs, tmp_path: Path, spec: str
) -> None:
    """`--resume-app myapp.agents` was checked only inside the resumer child, after the
    projector had taken the partitions and the API was serving: the server came up, then went
    down. It must exit 2 naming the option before it starts any role (or builds the ledger)."""
    settings = isolated.settings(Settings)
    args = ("server", "--port", str(_free_port()), "--resume-app", spec)
    proc = procs.python("server", "toolledger", *args, env=_env(settings, tmp_path))
    assert await proc.wait_exit(timeout=60) == ExitStatus.USAGE, proc.output()
    out = proc.output()
    assert "--resume-app" in out and spec in out, out
    assert "started the" not in out and "serving the API" not in out and "owns [" not in out
