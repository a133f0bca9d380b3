"""What the runtime scenario suite runs on: its tools, clock, harness and second runtimes.

`tests/contract/test_runtime_scenarios.py` states the scenarios; this module holds the parts
that are not themselves claims: tools that misbehave in one specific way each, a clock the test
moves instead of sleeping, the `Harness` bundling one test's ledger with the fake billing
system (`memory_harness`, `kafka_postgres_harness`: the two ledgers every scenario suite runs
on), and the two ways to get a second runtime (a worker subprocess on Kafka + PostgreSQL, a
`Ledger` with frozen commands on the memory stack).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.fake_billing import Credit, FakeBilling, find_credit, use_service
from tests.fake_billing import service as billing_service
from tests.isolated import Isolated, child_env, running_ledger
from toolledger import (
    Ledger,
    ProjectorSettings,
    ReconcileOutcome,
    Settings,
    Tool,
    ToolCallError,
    ToolContext,
    ToolFailedError,
    ToolNotAttemptedError,
    ToolOutcome,
    Toolset,
    external,
    read,
    write,
)
from toolledger.events.log import Position
from toolledger.events.models import CallCompleted, Event, utcnow
from toolledger.events.records import CallRecord, Verdict
from toolledger.events.signing import SigningKey, sign
from toolledger.wiring.commands import LedgerCommands
from toolledger.wiring.stack import LedgerStack

KEY_ID = "ops-1"
SIGNING_KEY = SigningKey.from_seed(KEY_ID, b"runtime-harness-operator-key-32b")
ROOT = Path(__file__).resolve().parents[2]
ARGS = {"account_id": "acct-1", "amount_cents": 2500}

calls: Counter[str] = Counter()
gate = {"release": asyncio.Event()}
#: What `credit_found_late`'s reconcile hook does before it answers (a test sets it).
before_finding: dict[str, Callable[[CallRecord], Awaitable[None]]] = {}


class Clock:
    """Real time plus an offset the test moves: deadlines pass without sleeping."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return utcnow() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


scenario = Toolset("scenario")


@scenario.tool(read())
async def flaky_lookup(order_id: str, context: ToolContext) -> str:
    """Fails twice with a connection error, then finds the order."""
    calls["flaky_lookup"] += 1
    if context.attempt < 3:
        raise ConnectionError("connection reset by peer")
    return f"order {order_id} shipped"


@scenario.tool(read(), timeout=0.2)
async def slow_lookup(order_id: str, context: ToolContext) -> str:
    """Hangs past its timeout on the first attempt only."""
    calls["slow_lookup"] += 1
    if context.attempt == 1:
        await asyncio.sleep(30)
    return order_id


@scenario.tool(external(), timeout=0.3)
async def credit_then_hang(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The credit lands, then the answer never comes back: the timeout is after sending."""
    calls["credit_then_hang"] += 1
    async with context.sending():
        await billing_service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        await asyncio.sleep(30)
    raise AssertionError("unreachable")


@scenario.tool(write())
async def credit_with_expiring_token(
    account_id: str, amount_cents: int, context: ToolContext
) -> Credit:
    """Refuses the first time (token expired, nothing sent), works the second."""
    calls["credit_with_expiring_token"] += 1
    if calls["credit_with_expiring_token"] == 1:
        raise ToolNotAttemptedError("the billing token expired; refresh it")
    async with context.sending():
        return await billing_service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@scenario.tool(write())
async def credit_unreachable(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Cannot connect, before anything is sent."""
    calls["credit_unreachable"] += 1
    if account_id:
        raise ConnectionRefusedError("billing is down")
    async with context.sending():
        return await billing_service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@scenario.tool(external())
async def declined_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The other system says no, definitely."""
    calls["declined_credit"] += 1
    raise ToolFailedError(f"account {account_id} is closed ({context.idempotency_key})")


@scenario.tool(external(approval=True))
async def large_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Needs an operator's approval first."""
    calls["large_credit"] += 1
    async with context.sending():
        return await billing_service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@scenario.tool(external())
async def credit_when_released(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Makes the credit, then returns only when the test releases it."""
    calls["credit_when_released"] += 1
    async with context.sending():
        credit = await billing_service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
    await gate["release"].wait()
    return credit


async def _find_credit_late(record: CallRecord, context: ToolContext) -> ReconcileOutcome:
    """`find_credit`, after whatever the test lets happen while the hook is being asked."""
    if "run" in before_finding:
        await before_finding["run"](record)
    return await find_credit(record, context)


@scenario.tool(external(), reconcile=_find_credit_late)
async def credit_found_late(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A credit whose reconcile hook answers only after the test's `before_finding`."""
    calls["credit_found_late"] += 1
    async with context.sending():
        return await billing_service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@dataclasses.dataclass
class Harness:
    """One test's ledger, its stack, the fake billing system and the clock."""

    ledger: Ledger
    stack: LedgerStack
    service: FakeBilling
    clock: Clock
    tmp: Path
    settings: Settings | None = None

    def new_ledger(self, verdict_timeout: float = 5) -> Ledger:
        """Another runtime on the same ledger, remembering nothing (a fresh process)."""
        return Ledger.from_stack(self.stack, verdict_timeout=verdict_timeout, clock=self.clock)

    async def call(self, tool: Tool[Any, Any], call_id: str = "c1", **kw: Any) -> ToolOutcome[Any]:
        kw.setdefault("arguments", ARGS)
        kw.setdefault("run_id", "r1")
        kw.setdefault("tenant_id", "acme")
        return await self.ledger.call(tool, tool_call_id=call_id, **kw)

    async def record(self, key: str, status: str | None = None) -> CallRecord:
        """The key's record once it exists (and has `status`), polling for up to 10 s."""
        give_up = time.monotonic() + 10
        while True:
            record = await self.stack.store.get_call(key)
            if record is not None and (status is None or record.status == status):
                return record
            assert time.monotonic() < give_up, f"{key} never reached {status}: {record}"
            await asyncio.sleep(0.02)

    async def append(self, event: Event) -> Verdict:
        return await self.stack.commands.append_and_await(event, 10)

    async def operator(self, cls: type[Any], record: CallRecord, **fields: Any) -> Verdict:
        event = cls(
            key=record.key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant_id=record.tenant_id,
            occurred_at=self.clock(),
            operator="alice",
            reason="checked the billing console",
            expected_version=record.version,
            **fields,
        )
        return await self.append(sign(event, SIGNING_KEY))


async def late_completed(h: Harness) -> None:
    """r1:c1's own runtime reports, late, that the credit went through: a late outcome."""
    record = await h.record("r1:c1")
    verdict = await h.append(
        CallCompleted(
            key=record.key,
            run_id=record.run_id,
            tool_call_id=record.tool_call_id,
            tenant_id=record.tenant_id,
            occurred_at=h.clock(),
            reservation_id=record.reservation_id,
            result_json='{"credit_id":"cr_late"}',
        )
    )
    assert (verdict.accepted, verdict.reason) == (False, "late_outcome")


@asynccontextmanager
async def memory_harness(tmp: Path, **options: Any) -> AsyncIterator[Harness]:
    """A harness on `Ledger.memory()` (`options` go to it), the billing system in `tmp`."""
    clock = Clock()
    service = use_service(FakeBilling(tmp / "billing.db"))
    ledger = await Ledger.memory(SIGNING_KEY, verdict_timeout=5, clock=clock, **options)
    try:
        yield Harness(ledger, ledger.stack, service, clock, tmp)
    finally:
        await ledger.close()


@asynccontextmanager
async def kafka_postgres_harness(
    tmp: Path, isolated: Isolated, **settings: Any
) -> AsyncIterator[Harness]:
    """A harness on this test's Kafka topics and PostgreSQL schema with an in-process projector
    (`settings` are the projector's own fields), the billing system in `tmp`."""
    clock = Clock()
    service = use_service(FakeBilling(tmp / "billing.db"))
    on = _projector_settings(isolated, **settings)
    async with running_ledger(on, verdict_timeout=5, clock=clock) as ledger:
        yield Harness(ledger, ledger.stack, service, clock, tmp, on)


def kafka_settings(
    pg_dsn: str, bootstrap: str, schema: str, topic_prefix: str
) -> ProjectorSettings:
    """One test's services, schema and topic prefix, 2 partitions, the harness's public key."""
    return _projector_settings(Isolated(pg_dsn, bootstrap, schema, topic_prefix + "."))


def _projector_settings(isolated: Isolated, **settings: Any) -> ProjectorSettings:
    return isolated.settings(
        ProjectorSettings, verify_keys=SIGNING_KEY.verify_keys(), verdict_timeout_s=5, **settings
    )


def reset() -> None:
    """Forget the previous test's counts and gate."""
    calls.clear()
    gate["release"] = asyncio.Event()
    before_finding.clear()


def _exists(path: Path) -> bool:
    return path.exists()


async def wait_for_file(path: Path, proc: asyncio.subprocess.Process, timeout: float = 15) -> None:
    """Bounded polling for a marker file the worker writes; fails with its stderr if it died."""
    give_up = time.monotonic() + timeout
    while not _exists(path):
        if proc.returncode is not None or time.monotonic() > give_up:
            err = b""
            if proc.returncode is not None and proc.stderr is not None:
                err = await proc.stderr.read()
            raise AssertionError(f"worker never wrote {path.name}: {err.decode()[-2000:]}")
        await asyncio.sleep(0.02)


class FrozenCommands(LedgerCommands):
    """Commands of a runtime that dies right before appending an outcome.

    `frozen` is set when the outcome is about to be appended; `kill()` then ends that append
    the way a SIGKILL would: nothing is appended, ever.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.frozen = asyncio.Event()
        self._killed = asyncio.Event()

    def kill(self) -> None:
        self._killed.set()

    async def append(self, event: Event, timeout: float) -> Position:
        if event.type in ("call_completed", "call_failed", "call_indeterminate"):
            self.frozen.set()
            await self._killed.wait()
            raise asyncio.CancelledError
        return await super().append(event, timeout)


def answer_of(got: object) -> Any:
    """A race participant's answer in one comparable word: the credit id, or the error name."""
    if isinstance(got, ToolCallError):
        return type(got).__name__
    if isinstance(got, ToolOutcome) and isinstance(got.value, Credit):
        return got.value.credit_id
    raise AssertionError(f"unexpected answer {got!r}")


async def start_worker(
    h: Harness, mode: str, tool: Tool[Any, Any], call_id: str
) -> tuple[asyncio.subprocess.Process, Path, Path]:
    """Start `tests/integration/crash_worker.py` in `mode` against this test's schema and topics.

    Returns the process and the paths of its `ready` marker and of the `go` file it waits for.
    """
    assert h.settings is not None
    ready, go = h.tmp / f"{mode}.ready", h.tmp / f"{mode}.go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), **child_env(h.settings)}
    argv = [
        *("-m", "tests.integration.crash_worker", mode),
        *("--service", str(h.service.path), "--ready", str(ready), "--go", str(go)),
        *("--tool", tool.name.split(".", 1)[1], "--run", "r1", "--call", call_id),
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return proc, ready, go
