"""The projection follows its leader on Kafka + PostgreSQL: nothing reads back what it appended.

A leader hands its projector every record it appended and proved, with what its fold decided,
and the projector writes those verdicts and rows as they are (`LedgerStore.apply_folded`). Its
reader fetches only what no batch of this process covers: a foreign writer's record (the API's
decision, a reconciler's finding, a runtime on the direct path), learnt from the writer's hint
or from a check of the partition's end offset, or fetched by the leader's next proof. Each test
counts what the projector fetched and what it folded itself, and ends by re-folding the log
into a fresh ledger, which must equal the live one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests import builders as b
from tests.integration.leader_support import all_led, leader_settings, runtime_port
from tests.integration.procs import until
from tests.isolated import Isolated, running_stack
from toolledger.events.codec import encode
from toolledger.events.log import partition_for
from toolledger.events.models import CallReserved, Event
from toolledger.events.records import Verdict
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.projector import Projector
from toolledger.projections.replay import replay
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

pytestmark = pytest.mark.both_brokers

RUN = "r-follows"


async def _carried(stack: LedgerStack, port: LeaderPort, partitions: int) -> Projector:
    """`stack`'s projector once every partition has been asked of its leader and is parked."""
    projector = stack.projector
    assert projector is not None
    runs = {partition_for(f"warm-{i}", partitions): f"warm-{i}" for i in range(50)}
    for partition in range(partitions):
        assert (await port.append_and_await(b.reserved(runs[partition], "c1"), 10)).accepted
    await until(
        lambda: projector.parked == set(range(partitions)),
        timeout=10,
        what="every partition parked",
        interval=0.005,
    )
    return projector


async def _same_as_a_refold(stack: LedgerStack) -> None:
    """The live ledger equals the log re-folded into a fresh one up to its stored offsets,
    once the projection caught up with the log."""
    ends = await stack.events.end_offsets()

    async def caught_up() -> dict[int, int] | None:
        stored = {p: (await stack.store.partition_state(p)) for p in ends}
        offsets = {p: s.next_offset for p, s in stored.items() if s is not None}
        return offsets if all(offsets[p] >= ends[p] for p in ends) else None

    targets = await until(caught_up, timeout=10, what="the projection caught up with the log")
    fresh = MemoryLedger(verify_keys=stack.store.verify_keys)
    report = await replay(stack.events, fresh, targets=targets)
    assert report.replay_digest == await stack.store.digest()


@pytest.mark.parametrize("partitions", [2])
async def test_the_projector_never_fetches_what_its_leader_appended_and_acknowledged(
    isolated: Isolated, partitions: int
) -> None:
    """Fetching back its leader's own records cost the local broker ten times what appending
    them did, and folding them again a tenth of the projector: with end offsets checked every
    20 ms, serial and concurrent calls through the leader must reach the ledger without one
    record fetched or folded by the projector, all written as the leader folded them."""
    settings = leader_settings(isolated, partitions=partitions, idle_fetch_bound_ms=20)
    async with running_stack(settings) as stack, runtime_port(stack, settings) as port:
        await all_led(port, partitions)
        projector = await _carried(stack, port, partitions)
        stats = projector.stats
        before = (stats.fetched, stats.folded_here, stats.handed)
        checks = projector.carried.checks if projector.carried else 0

        async def run(n: int, calls: int) -> None:
            for c in range(calls):
                reserved = b.reserved(f"r-own-{n}", f"c{c}", t=c)
                assert (await port.append_and_await(reserved, 10)).accepted
                assert (await port.append_and_await(b.completed(reserved, t=c + 0.5), 10)).accepted

        await run(0, 5)
        await asyncio.gather(*(run(n, 4) for n in range(1, 17)))
        await _same_as_a_refold(stack)
        assert (stats.fetched, stats.folded_here) == before[:2], "own records fetched or refolded"
        assert stats.handed - before[2] == 2 * (5 + 16 * 4)
        assert stats.written_folded == stats.handed, "a handed record was folded again"
        assert projector.carried is not None and projector.carried.checks > checks


@asynccontextmanager
async def _given_up(
    isolated: Isolated, bound_ms: int
) -> AsyncIterator[tuple[LedgerStack, LeaderPort, Projector, CallReserved, int]]:
    """A stack whose leader carries every partition (end offsets checked every `bound_ms`),
    after the first leader batch committed: a call reserved and left indeterminate, through
    the leader; with the call's version."""
    settings = leader_settings(isolated, idle_fetch_bound_ms=bound_ms)
    async with running_stack(settings) as stack, runtime_port(stack, settings) as port:
        await all_led(port, settings.partitions)
        projector = await _carried(stack, port, settings.partitions)
        reserved = b.reserved(RUN, "c1")
        assert (await port.append_and_await(reserved, 10)).accepted
        given_up = b.indeterminate(reserved)
        verdict = await port.append_and_await(given_up, 10)
        assert verdict.accepted and verdict.call is not None

        async def committed() -> bool:
            return bool(await stack.store.verdicts([given_up.event_id]))

        await until(committed, timeout=10, what="the first batch committed")
        yield stack, port, projector, reserved, verdict.call.version


Foreign = Callable[[LedgerStack, CallReserved, int], Awaitable[list[Event]]]


async def _api_decision(stack: LedgerStack, reserved: CallReserved, version: int) -> list[Event]:
    """An operator's signed decision, appended and awaited as the API does."""
    decision = b.resolved(reserved, version, outcome="completed")
    assert (await stack.commands.append_and_await(decision, 10)).accepted
    return [decision]


async def _reconcile_finding(
    stack: LedgerStack, reserved: CallReserved, version: int
) -> list[Event]:
    """A reconciler's finding that the call did complete, appended and awaited."""
    finding = b.found(reserved, version)
    assert (await stack.commands.append_and_await(finding, 10)).accepted
    return [finding]


async def _direct_runtime(stack: LedgerStack, reserved: CallReserved, version: int) -> list[Event]:
    """A runtime on the direct path (its port: append, then await the committed verdict)
    reserving and completing another call of the same run. Two hints this close together are
    a busy foreign writer, whose partition is tailed until it goes quiet
    (`toolledger.projections.carried`): the leader's next batch is appended once the
    partition is parked again, as it would be after any writer went quiet."""
    direct = StackPort(stack)
    other = b.reserved(RUN, "c-direct")
    assert (await direct.append_and_await(other, 10)).accepted
    done = b.completed(other)
    assert (await direct.append_and_await(done, 10)).accepted
    projector = stack.projector
    assert projector is not None
    partition = partition_for(RUN, await stack.events.partition_count())
    await until(
        lambda: partition in projector.parked,
        timeout=10,
        what="the direct runtime's partition parked again",
        interval=0.005,
    )
    return [other, done]


async def _unhinted(stack: LedgerStack, reserved: CallReserved, version: int) -> list[Event]:
    """A writer whose hint never arrives: only the check of the end offset finds its record."""
    finding = b.found(reserved, version)
    await stack.events.append(finding.run_id, encode(finding), hint=False)

    async def committed() -> dict[Any, Verdict] | None:
        return await stack.store.verdicts([finding.event_id]) or None

    await until(committed, timeout=10, what="the unhinted record committed")
    return [finding]


@pytest.mark.parametrize(
    ("foreign", "bound_ms"),
    [
        (_api_decision, 60_000),
        (_reconcile_finding, 60_000),
        (_direct_runtime, 60_000),
        (_unhinted, 300),
    ],
    ids=["api-decision", "reconcile-finding", "direct-runtime", "unhinted"],
)
async def test_a_foreign_record_between_two_leader_batches_is_fetched_alone(
    isolated: Isolated, foreign: Foreign, bound_ms: int
) -> None:
    """A record someone else appends to a partition the leader carries must be projected while
    the leader appends nothing after it (its writer awaits the committed verdict), and be the
    only record the projector fetches: not the leader's batches on either side of it. A
    hinted record is fetched on its hint: the end offsets are checked only once a minute here,
    so a writer awaiting its verdict would time out if the hint were not enough (a resumed
    partition once waited out the reader's idle back-off, and a verdict took a second). An
    unhinted one is found by the end-offset check, within the idle bound (300 ms here)."""
    async with _given_up(isolated, bound_ms) as (stack, port, projector, reserved, version):
        fetched = projector.stats.fetched
        written = await foreign(stack, reserved, version)
        later = b.reserved(RUN, "c-later")
        assert (await port.append_and_await(later, 10)).accepted
        assert port.stats["direct"] == 0
        await _same_as_a_refold(stack)
        assert projector.stats.fetched - fetched == len(written)
        committed = await stack.store.verdicts([e.event_id for e in written])
        assert all(committed[e.event_id].accepted for e in written)


async def test_a_foreign_record_is_fetched_by_the_leaders_next_proof_before_any_check(
    isolated: Isolated,
) -> None:
    """An unhinted foreign record followed by a leader batch before any end check: the batch's
    acknowledged offset is past what memory folded, so the leader fetches the gap, folds it
    first and hands it over with its own; the projector fetches nothing."""
    async with _given_up(isolated, 60_000) as (stack, port, projector, reserved, version):
        fetched, handed = projector.stats.fetched, projector.stats.handed
        finding = b.found(reserved, version)
        await stack.events.append(finding.run_id, encode(finding), hint=False)
        later = b.reserved(RUN, "c-later")
        assert (await port.append_and_await(later, 10)).accepted
        await _same_as_a_refold(stack)
        assert projector.stats.fetched == fetched
        assert projector.stats.handed - handed == 2
        record = await stack.store.get_call(reserved.key)
        assert record is not None and record.status == "completed"
