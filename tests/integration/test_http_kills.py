"""A runtime SIGKILLed in the middle of an HTTP refund, on Kafka + PostgreSQL.

The worker (`tests.integration.http_worker`, a real OS process) reserves the call and sends the
refund; the fake payments API holds the request, the test SIGKILLs the worker, then lets the
fake make the refund, whose answer now goes nowhere. The ledger says `started`. Once the call's
lease is over, a reconciler resends the request with the same key, the fake replays its first
answer, and the call is completed with it: one refund, and a rerun of the key returns that
refund without a third request.

Two reconcilers: the `Reconciler` class in this process on a clock the test moves, and a real
`toolledger reconciler --tools tests.http_tools` process (its faust app, its own clock), which
is the production road. Every wait is a polled condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import http_tools
from tests.contract.runtime_harness import ROOT, Harness, kafka_postgres_harness
from tests.http_tools import PAYMENTS_URL_ENV, refund
from tests.integration.http_worker import ARGUMENTS
from tests.integration.procs import Procs, toolledger_env, until
from tests.isolated import Isolated, child_env
from toolledger.events.records import CallRecord
from toolledger.http.fake import FakePayments
from toolledger.processors.reconciler import Reconciler
from toolledger.wiring.stack_port import StackPort

KEY = "r1:c1"


@pytest.fixture
async def h(tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
    async with kafka_postgres_harness(tmp_path, isolated) as h:
        yield h


@pytest.fixture
async def api(h: Harness) -> AsyncIterator[FakePayments]:
    """The fake, and the test process's tools pointed at it."""
    async with http_tools.fake_payments() as fake:
        yield fake


async def killed_mid_request(h: Harness, api: FakePayments) -> CallRecord:
    """The worker's refund held at the fake, the worker SIGKILLed, then the refund made."""
    api.script.append("hold")
    assert h.settings is not None
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        **child_env(h.settings),
        PAYMENTS_URL_ENV: api.url,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.http_worker",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await until(api.posts, timeout=30, what="the worker's refund request")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == -signal.SIGKILL
    api.release()
    await until(lambda: api.refunds, timeout=10, what="the held refund to be made")
    return await h.record(KEY, "started")


async def assert_one_refund_heard(h: Harness, api: FakePayments) -> None:
    record = await h.record(KEY, "completed")
    assert record.settled_by == "reconcile"
    outcome = await h.call(refund, "c1", arguments=ARGUMENTS)
    assert outcome.value is not None and outcome.value.id in api.refunds
    assert len(api.refunds) == 1 and len(api.posts()) == 2


async def test_a_runtime_killed_mid_request_is_settled_by_one_resend(
    h: Harness, api: FakePayments
) -> None:
    """A runtime dying between sending a refund and hearing its answer must not leave the
    call to a second refund or to an operator: the reconciler's resend with the same key hears
    the first answer, and the fake makes one refund. Not while the call may still run."""
    started = await killed_mid_request(h, api)
    reconciler = Reconciler(
        {refund.name: refund}, StackPort(h.stack), clock=h.clock, read_call=h.stack.store.get_call
    )
    assert reconciler.scan([started]) == 0, "resent while the runtime may still run"
    h.clock.advance(refund.budget + 60)
    assert reconciler.scan([started]) == 1
    await until(lambda: reconciler.busy == 0, timeout=15, what="the resend")
    await assert_one_refund_heard(h, api)


async def test_the_reconciler_process_resends_the_killed_runtimes_refund(
    h: Harness, api: FakePayments, tmp_path: Path
) -> None:
    """The same through `toolledger reconciler` itself (its faust app and schedule): a tool
    declared `replays_key_for` needs no hook for the reconciler to settle it."""
    await killed_mid_request(h, api)
    assert h.settings is not None
    env = {**toolledger_env(h.settings), PAYMENTS_URL_ENV: api.url}
    procs = Procs(tmp_path)
    try:
        reconciler = procs.python(
            "reconciler",
            "toolledger",
            "reconciler",
            "--tools",
            "tests.http_tools",
            "--session-timeout",
            "6",
            "--scan-every",
            "0.1",
            env=env,
        )

        # The first resend waits for the lease: the reservation's deadline (the tool's
        # budget) plus the clock-skew grace, on the reconciler's own clock.
        async def settled() -> bool:
            assert reconciler.alive(), reconciler.output()[-3000:]
            record = await h.stack.store.get_call(KEY)
            return record is not None and record.status == "completed"

        await until(settled, timeout=refund.budget + 60, what="the reconciler's resend")
    finally:
        procs.close()
    await assert_one_refund_heard(h, api)
