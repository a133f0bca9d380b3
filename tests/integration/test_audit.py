"""Analytics subscribe to facts; auditors read the log itself (real Kafka + PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from tests import builders as b
from tests.integration.procs import run_toolledger, toolledger_env
from tests.isolated import Isolated, running_stack
from toolledger.audit import story
from toolledger.events.models import CallResolved, Event
from toolledger.events.signing import sign
from toolledger.projections.facts import Fact
from toolledger.settings import ProjectorSettings as Settings
from toolledger.subscribe import subscribe, subscribe_group
from toolledger.wiring.stack import LedgerStack


@pytest.fixture
def settings(isolated: Isolated) -> Settings:
    return isolated.settings(Settings, verify_keys=b.KEYS)


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[LedgerStack]:
    async with running_stack(settings) as stack:
        yield stack


async def _project(stack: LedgerStack, *events: Event) -> None:
    for event in events:
        await stack.commands.append_and_await(event, timeout=10)


def _workload() -> list[Event]:
    events: list[Event] = []
    for n in range(12):
        r = b.reserved(f"run-{n % 4}", f"c{n}")
        events += [r, b.completed(r) if n % 2 else b.indeterminate(r)]
    return events


async def test_subscribe_from_the_beginning_sees_every_fact_once_in_order_per_run(
    stack: LedgerStack,
) -> None:
    """An analytics consumer must count each decided event exactly once even though facts
    are published at least once, and see each run's facts in the order they were decided."""
    events = _workload()
    await _project(stack, *events)
    # a resend of an already decided event (a producer retry) must not show up twice
    await stack.commands.append(events[0], timeout=5)
    await _project(stack, b.reserved("run-0", "after-resend"))
    seen = [f async for f in subscribe(stack.facts, follow=False)]
    ids = [f.verdict.event_id for f in seen]
    assert len(ids) == len(set(ids)) == len(events) + 1
    for run in {e.run_id for e in events}:
        mine = [e.event_id for e in events if e.run_id == run]
        assert [i for i in ids if i in set(mine)] == mine
    only_completed = [
        f async for f in subscribe(stack.facts, follow=False, event_types={"call_completed"})
    ]
    assert {f.verdict.event_type for f in only_completed} == {"call_completed"}
    assert len(only_completed) == 6


async def test_a_consumer_group_resumes_where_it_left_off(
    stack: LedgerStack, settings: Settings
) -> None:
    """A restarted analytics job must not start over: with a consumer group it resumes after
    the last fact it finished (at most the one in hand is delivered again)."""
    events = _workload()
    await _project(stack, *events)
    first: list[Fact] = []
    group = f"analytics-{settings.topic_prefix}"

    def consumer() -> contextlib.aclosing[AsyncGenerator[Fact, None]]:
        # The default session (6 s): Apache Kafka refuses a shorter one by default
        # (`group.min.session.timeout.ms`). The 2 s this test took to go faster on tansu, where
        # a join takes half the session timeout, failed every join there.
        return contextlib.aclosing(subscribe_group(settings, group))

    async with asyncio.timeout(30), consumer() as facts:
        async for fact in facts:
            first.append(fact)
            if len(first) == 10:
                break
    more = [b.reserved("run-9", f"late{n}") for n in range(3)]
    await _project(stack, *more)
    expected = {e.event_id for e in [*events, *more]}
    handled = {f.verdict.event_id for f in first}
    again: list[Fact] = []
    async with asyncio.timeout(30), consumer() as facts:
        async for fact in facts:
            again.append(fact)
            if handled | {f.verdict.event_id for f in again} >= expected:
                break
    before = {f.verdict.event_id for f in first[:-1]}
    assert not before & {f.verdict.event_id for f in again}, "already handled facts came back"
    assert {e.event_id for e in more} <= {f.verdict.event_id for f in again}
    assert len(again) <= len(expected) - len(first) + 1


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **toolledger_env(settings), "COLUMNS": "250"}
    return run_toolledger(env, *args)


async def test_audit_as_of_gives_the_state_before_an_operators_resolution(
    stack: LedgerStack, settings: Settings, pg_dsn: str
) -> None:
    """An auditor asking "what did the ledger say before alice resolved it?" must get the
    indeterminate record, and the key's story must name alice and every verdict."""
    r = b.reserved("audited", "c1", timeout=0)
    await _project(stack, r, b.indeterminate(r, t=0.5))
    await asyncio.sleep(0.05)  # the broker's timestamps are milliseconds: keep them apart
    before_resolution = datetime.now(UTC)
    await asyncio.sleep(0.05)
    resolution = sign(
        CallResolved(
            key=r.key,
            run_id=r.run_id,
            tool_call_id=r.tool_call_id,
            tenant_id=r.tenant_id,
            operator="alice",
            reason="no credit in the billing console",
            expected_version=2,
            outcome="failed",
        ),
        b.SIGNING_KEY,
    )
    verdict = await stack.commands.append_and_await(resolution, timeout=10)
    assert verdict.accepted, verdict.detail

    entries = await story(stack.events, stack.store, run_id="audited", key=r.key)
    assert [e.event.type for e in entries] == [
        "call_reserved",
        "call_indeterminate",
        "call_resolved",
    ]
    assert entries[-1].actor == "operator:alice"
    assert all(e.verdict is not None and e.verdict.accepted for e in entries)

    # As toolledger prints times: ISO, milliseconds, `Z` (an offset and none are tested below).
    stamp = before_resolution.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    into = f"{settings.schema_name}_asof"
    try:
        shown = _cli(settings, "audit", r.key, "--as-of", stamp, "--into", into)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "was indeterminate (version 2, not settled)" in shown.stdout
        assert "settled by -" not in shown.stdout
        now = _cli(settings, "audit", r.key)
        assert now.returncode == 0, now.stderr
        assert "operator:alice" in now.stdout and "call_resolved" in now.stdout
        # In memory, as `replay` folds, with the same moment written with an offset.
        offset = before_resolution.astimezone(timezone(timedelta(hours=2))).isoformat()
        memory = _cli(settings, "audit", r.key, "--as-of", offset)
        assert memory.returncode == 0, memory.stdout + memory.stderr
        assert "in memory" in memory.stdout and "was indeterminate" in memory.stdout
        after = _cli(settings, "audit", r.key, "--as-of", datetime.now(UTC).isoformat())
        assert "was failed (version 3, settled by operator)" in after.stdout, after.stdout
        # `--into` a schema that holds a projection is a usage error (2), not a log that
        # differs from the ledger's (4).
        again = _cli(settings, "audit", r.key, "--as-of", stamp, "--into", into)
        assert again.returncode == 2, again.stdout + again.stderr
        assert f"schema {into} already holds a projection" in again.stderr
        replayed = _cli(settings, "replay", "--into", settings.schema_name)
        assert replayed.returncode == 2, replayed.stdout + replayed.stderr
        assert f"schema {settings.schema_name} already holds a projection" in replayed.stderr
        bad = _cli(settings, "audit", r.key, "--as-of", "yesterday")
        assert bad.returncode == 2 and "give it as toolledger prints them" in bad.stderr
    finally:
        import asyncpg

        conn = await asyncpg.connect(pg_dsn)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{into}" CASCADE')
        await conn.close()
