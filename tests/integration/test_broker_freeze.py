"""Apache Kafka frozen (SIGSTOP) for longer than a runtime's timeouts, then thawed (SIGCONT).

A frozen broker keeps its connections open and answers nothing, the worst way for Kafka to be
gone: no error arrives, only silence. Calls made meanwhile must each end within their bound and
say what they know: a call refused before its tool ran is not attempted and had no effect; a
call returned completed took effect once; one whose outcome could not be recorded is unknown
(indeterminate), never reported as not attempted. Once the broker is thawed the ledger must
agree with every answer, and new calls must go through. The broker is this test's own, never
the session's.

By design a runtime never gives up an outcome (it is appended until it lands), so a call whose
tool ran waits for the broker; only a reservation has a bound of its own, the verdict timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import builders as b
from tests.integration.procs import Procs, toolledger_env, until
from toolledger import Ledger, LedgerUnavailable, ToolContext, Toolset, external
from toolledger.devstack import Service, start_apache_kafka, stop_service
from toolledger.runtime.errors import ToolCallIndeterminate
from toolledger.settings import ProjectorSettings

#: Credits made, by account (each call credits an account of its own).
effects: Counter[str] = Counter()
freeze_tools = Toolset("freeze")


@freeze_tools.tool(external(), timeout=5)
async def credit(account: str, context: ToolContext) -> str:
    """A credit per idempotency key, counted where the test can see it."""
    async with context.sending():
        effects[account] += 1
        await asyncio.sleep(TOOL_S)
        return f"credit-{account}"


VERDICT_TIMEOUT_S = 3.0
#: How long the tool takes after its effect: a freeze lands between reservation and outcome.
TOOL_S = 1.0
#: Longer than every timeout a runtime has: its verdict timeout, the leader's (1 s), the tool's.
FROZEN_S = 10.0
#: A reservation that gets no verdict is refused within the verdict timeout, whatever the broker
#: does: the leader's bound, then the direct path's verdict timeout, and slack for a busy machine.
REFUSED_WITHIN_S = 1.0 + 2 * VERDICT_TIMEOUT_S + 3.0
#: A call whose tool ran appends its outcome until it lands (a runtime never gives an outcome
#: up: docs/architecture.md, "Giving up is safe"), so it ends soon after the thaw, never later.
AFTER_THAW_S = 15.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Service]:
    service = start_apache_kafka(tmp_path / "broker", 120.0)
    try:
        yield service
    finally:
        assert service.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(service.pid, signal.SIGCONT)
        stop_service(service)


async def _call(ledger: Ledger, n: int) -> tuple[str, str, float]:
    """Call `credit` for account `a<n>`; (account, how it ended, seconds it took)."""
    account = f"a{n}"
    began = time.monotonic()
    try:
        outcome = await ledger.call(
            credit,
            run_id=f"run-{n}",
            tool_call_id="c1",
            tenant_id="acme",
            arguments={"account": account},
        )
        ended = "completed" if outcome.status == "completed" else f"returned {outcome.status}"
    except LedgerUnavailable:
        ended = "not attempted"
    except ToolCallIndeterminate:
        ended = "indeterminate"
    return account, ended, time.monotonic() - began


async def test_calls_during_a_frozen_broker_end_in_time_and_tell_the_truth(
    broker: Service, pg_dsn: str, pg_schema: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Against a broker frozen past every timeout: a call refused before its tool ran must be
    refused within its verdict timeout, frozen broker or not, and have had no effect; a call
    whose tool ran must end soon after the thaw, with exactly one effect; and afterwards the
    ledger must hold what each call was told and accept new calls."""
    assert broker.pid is not None
    settings = ProjectorSettings(
        database_url=pg_dsn,
        kafka_bootstrap=broker.address,
        schema_name=pg_schema,
        topic_prefix=f"{topic_prefix}.",
        partitions=2,
        verify_keys=b.KEYS,
        verdict_timeout_s=VERDICT_TIMEOUT_S,
    )
    procs = Procs(tmp_path)
    effects.clear()
    try:
        projector = procs.projector("projector", toolledger_env(settings))
        await projector.wait_for(r"owns \[0, 1\]", timeout=90)
        async with await Ledger.connect(settings) as ledger:
            warm = await _call(ledger, 0)
            assert warm[1] == "completed", warm
            # A call every 50 ms from 2 s before the freeze to 1 s into it: some finish before
            # it, some are inside their tool when it starts, some start while it lasts.
            calls = []
            for n in range(1, 41):
                calls.append(asyncio.create_task(_call(ledger, n)))
                await asyncio.sleep(0.05)
            os.kill(broker.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            for n in range(41, 61):
                calls.append(asyncio.create_task(_call(ledger, n)))
                await asyncio.sleep(0.05)
            await asyncio.sleep(FROZEN_S - (time.monotonic() - frozen_at))
            os.kill(broker.pid, signal.SIGCONT)
            thawed_at = time.monotonic()
            ended = await asyncio.wait_for(asyncio.gather(*calls), AFTER_THAW_S + 5)
            late = time.monotonic() - thawed_at
            assert late < AFTER_THAW_S, f"the last call ended {late:.1f} s after the thaw"
            refused_late = [
                (a, round(took, 1))
                for a, how, took in ended
                if how == "not attempted" and took > REFUSED_WITHIN_S
            ]
            assert not refused_late, f"refusals past {REFUSED_WITHIN_S:.0f} s: {refused_late}"
            by_how = Counter(how for _, how, _ in ended)
            print(f"calls around a {FROZEN_S:.0f} s freeze: {dict(by_how)}")
            assert by_how["not attempted"] >= 1 and by_how["completed"] >= 1, by_how
            for account, how, _ in ended:
                if how == "not attempted":
                    assert effects[account] == 0, f"{account}: not attempted, yet took effect"
                elif how == "completed":
                    assert effects[account] == 1, f"{account}: completed, {effects[account]}x"
                else:
                    assert how == "indeterminate", f"{account}: {how}"
                    assert effects[account] <= 1
            assert await until(
                lambda: _call_completes(ledger, 99), timeout=60, what="a call after the thaw"
            )
            assert await ledger.wait_background(30), "abandons still not landed after the thaw"
            for account, how, _ in ended:
                record = await ledger.read_call(f"run-{account[1:]}:c1")
                if how == "completed":
                    assert record is not None and record.status == "completed", (account, record)
                elif how == "not attempted":
                    settled = record is None or (record.status == "failed" and record.not_attempted)
                    assert settled, (account, record)
                else:
                    assert record is not None and record.status != "failed", (account, record)
    finally:
        procs.close()


async def _call_completes(ledger: Ledger, n: int) -> bool:
    return (await _call(ledger, n))[1] == "completed"
