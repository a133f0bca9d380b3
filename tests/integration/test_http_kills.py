"""A runtime SIGKILLed in the middle of an HTTP refund, on Kafka + PostgreSQL.

The worker (`tests.integration.http_worker`, a real OS process) reserves the call and sends the
refund; the fake payments API holds the request, the test SIGKILLs the worker, then lets the
fake make the refund, whose answer now goes nowhere. The ledger says `started`. Once the call's
lease is over (the test's clock is moved, not slept on), the reconciler resends the request
with the same key, the fake replays its first answer, and the call is completed with it: one
refund, and a rerun of the key returns that refund without a third request.
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

from examples.http_refund.payments import FakePayments
from tests import http_tools
from tests.contract.runtime_harness import ROOT, Harness, kafka_postgres_harness
from tests.http_tools import STATUSES, refund
from tests.integration.http_worker import ARGUMENTS
from tests.integration.procs import until
from tests.isolated import Isolated, child_env
from toolledger.http import ToolHTTP
from toolledger.processors.reconciler import Reconciler
from toolledger.wiring.stack_port import StackPort


@pytest.fixture
async def h(tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
    async with kafka_postgres_harness(tmp_path, isolated) as h:
        yield h


async def test_a_runtime_killed_mid_request_is_settled_by_one_resend(
    h: Harness, tmp_path: Path
) -> None:
    """A runtime dying between sending a refund and hearing its answer must not leave the
    call to a second refund or to an operator: the reconciler's resend with the same key hears
    the first answer, and the fake makes one refund."""
    async with FakePayments() as api:
        api.script.append("hold")
        assert h.settings is not None
        env = {**os.environ, "PYTHONPATH": str(ROOT), **child_env(h.settings)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.http_worker",
            api.url,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await until(lambda: api.posts(), timeout=30, what="the worker's refund request")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
        assert proc.returncode == -signal.SIGKILL
        api.release()
        await until(lambda: api.refunds, timeout=10, what="the held refund to be made")
        started = await h.record("r1:c1", "started")

        client = ToolHTTP(base_url=api.url, statuses=STATUSES)
        previous = http_tools.use_payments(client)
        try:
            reconciler = Reconciler(
                {refund.name: refund},
                StackPort(h.stack),
                clock=h.clock,
                read_call=h.stack.store.get_call,
            )
            assert reconciler.scan([started]) == 0, "resent while the runtime may still run"
            h.clock.advance(refund.budget + 60)
            assert reconciler.scan([started]) == 1
            await until(lambda: reconciler.busy == 0, timeout=15, what="the resend")
            record = await h.record("r1:c1", "completed")
            assert record.settled_by == "reconcile"
            outcome = await h.call(refund, "c1", arguments=ARGUMENTS)
            assert outcome.value is not None and outcome.value.id in api.refunds
        finally:
            http_tools.use_payments(previous)
            await client.aclose()
        assert len(api.refunds) == 1 and len(api.posts()) == 2
