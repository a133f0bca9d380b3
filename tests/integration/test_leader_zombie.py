"""A leader frozen (SIGSTOP) and taken over, then resumed (SIGCONT): a zombie, on real processes.

Two projector processes: A leads every partition, B (`python -m toolledger projector`) waits
as its hot standby. A runtime in this process calls through A; A is frozen between batches
with requests on their way to it, and A's lock session is ended by hand long before A's lease
(600 s here) would end it, so B takes the partitions and their leadership while the runtime
goes on and A, woken, still trusts its lease. Then A resumes with those
requests in its socket buffer and B's records in the log. A runs
`tests.integration.leader_worker late-lock-checks`, which re-checks its locks only hourly, so
it is certain to act as a zombie that has not noticed: it answers what it was sent and sends
its next projection batch.

The log stays the only truth: everything A answered, before it froze and after it resumed,
must be what a re-fold of the log says; A's batch must fail the offset compare-and-set, after
which A answers nothing but NOT_LEADER for the partitions it lost; and nothing A did may change
the ledger, which equals the re-fold. Every process started is stopped by its pid at the end.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from pathlib import Path

from tests import builders as b
from tests.integration.leader_support import (
    all_led,
    freeze_between_batches,
    history_count,
    leader_settings,
    owns_every_partition,
    refold_matches,
    runtime_port,
)
from tests.integration.procs import Procs, toolledger_env, until
from tests.isolated import Isolated, running_stack
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.events.codec import encode
from toolledger.events.log import partition_for
from toolledger.events.models import CallReserved, Event
from toolledger.events.records import Verdict
from toolledger.leader.runtime_side.connection import LeaderConnection
from toolledger.leader.runtime_side.frames import Frame, Kind
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.wiring.stack import LedgerStack

#: What a projector process takes to import, connect, check the log and take its locks.
START_TIMEOUT = 30.0


async def _led_by(port: LeaderPort, partitions: int, address: str) -> None:
    async def check() -> bool:
        return set((await all_led(port, partitions)).values()) == {address}

    await until(check, timeout=START_TIMEOUT, what=f"every partition led from {address}")


async def test_a_frozen_leader_taken_over_answers_only_the_logs_verdicts_and_writes_nothing(
    isolated: Isolated, tmp_path: Path, replicas: list[str]
) -> None:
    """A leader SIGSTOPped while runtimes call it, whose partitions another projector takes,
    must never have answered anything but the log's verdicts, before it froze or after it
    resumed with requests still queued to it; once it has stood down it must answer nothing
    but NOT_LEADER for the partitions it lost, and its projection must write nothing (its
    compare-and-set fails): the ledger equals a re-fold. Meanwhile the runtime's calls get
    their verdicts, from the new leader once it is registered, none lost or applied twice."""
    # The runtime's bound: generous while A leads (its every answer is one checked below),
    # short once A is frozen (each call to it waits that long before going direct).
    settings = leader_settings(isolated, leader_timeout_ms=10_000)
    parts = settings.partitions
    # Run ids covering every partition, so each partition has calls on every path.
    runs = {partition_for(f"z{i}", parts): f"z{i}" for i in range(50)}
    assert len(runs) == parts
    reserved = [b.reserved(runs[i % parts], f"c{i}", t=i) for i in range(3 * parts)]
    completed = [b.completed(r, t=10 + i) for i, r in enumerate(reserved)]
    sent: list[Event] = []
    procs = Procs(tmp_path)
    db = LedgerDB(isolated.database_url, isolated.schema)
    # A long lease: A's lock session is ended by hand, and A trusts its lease on waking, so
    # only the compare-and-set can stop it (tests/integration/test_owner_lease.py lets the
    # lease end a frozen owner's session instead).
    env = {
        **toolledger_env(settings),
        "TOOLLEDGER_PROJECTOR_OWNERSHIP": "standby",
        "TOOLLEDGER_OWNER_LEASE_S": "600",
    }
    zombie_line = None
    try:
        a = procs.python("leader-a", "tests.integration.leader_worker", "late-lock-checks", env=env)
        await a.wait_for("leading", timeout=START_TIMEOUT)
        await owns_every_partition(db, a, parts)
        b_proc = procs.projector("leader-b", env)
        await b_proc.wait_for(r"owns \[\];", timeout=START_TIMEOUT)
        async with (
            running_stack(settings, run_projector=False) as stack,
            runtime_port(stack, settings) as port,
        ):
            # 1. A leads: its answers to every reservation and the first outcomes.
            a_address = str(next(iter((await all_led(port, parts)).values())))
            await _led_by(port, parts, a_address)
            first = reserved + completed[:parts]
            answered_by_a = {e.event_id: await port.append_and_await(e, 10) for e in first}
            sent += first
            assert port.stats == {"leader": len(first), "direct": 0}
            await until(
                lambda: _all_verdicts(stack, list(answered_by_a)),
                timeout=15,
                what="A's projection to commit what A answered",
            )

            # 2. A freezes with requests on their way to it: outcomes, and a resend of a
            # reservation it answered. PostgreSQL ends A's lock session; B takes over.
            port.bound = 0.3
            await freeze_between_batches(db, a)
            stalled: list[Event] = [*completed[parts : 2 * parts], reserved[0]]
            to_a = LeaderConnection(a_address)
            queued = [
                asyncio.create_task(to_a.request(Kind.APPEND, encode(e), 120)) for e in stalled
            ]
            assert await db.terminate([f"toolledger-locks-{a.pid}"]) == 1
            await owns_every_partition(db, b_proc, parts)

            # The runtime resends what it sent A (it timed out: direct, the same event_ids)
            # and goes on calling; B's leader answers once registered and looked up again.
            for event in stalled[:-1]:
                assert (await port.append_and_await(event, 10)).accepted
            sent += stalled[:-1]
            b_address = await until(
                lambda: _other_leader(port, parts, a_address),
                timeout=START_TIMEOUT,
                what="B registered as the leader of every partition",
            )
            via_b = port.stats["leader"]
            later = iter(
                completed[2 * parts :] + [b.reserved(runs[i % parts], f"d{i}") for i in range(200)]
            )

            async def b_answers() -> bool:
                event = next(later)
                assert (await port.append_and_await(event, 10)).accepted
                sent.append(event)
                return port.stats["leader"] - via_b >= parts

            await until(b_answers, timeout=30, what="the runtime's calls answered by B's leader")
            await _led_by(port, parts, b_address)
            await until(
                lambda: _all_verdicts(stack, [e.event_id for e in sent]),
                timeout=15,
                what="B's projection to commit every call",
            )
            before = await stack.store.snapshot()

            # 3. A resumes: what it answers now is checked below. Its next batch of each
            # partition fails the compare-and-set, and with that it stands down.
            mark = a.mark()
            a.resume()
            answers = await asyncio.wait_for(
                asyncio.gather(*queued, return_exceptions=True), timeout=30
            )
            for partition in runs:
                await a.wait_for(
                    rf"partition {partition}: expected next offset \d+, the ledger has \d+; "
                    "another projector took this partition over",
                    timeout=START_TIMEOUT,
                    after=mark,
                )
            zombie_line = [
                f.kind.name if isinstance(f, Frame) else type(f).__name__ for f in answers
            ]
            answered_after = {
                e.event_id: Verdict.model_validate_json(f.body)
                for e, f in zip(stalled, answers, strict=True)
                if isinstance(f, Frame) and f.kind is Kind.VERDICT
            }
            for run_id in runs.values():
                for kind, body in (
                    (Kind.APPEND, encode(_first_of(reserved, run_id))),
                    (Kind.READ, json.dumps({"key": f"{run_id}:c0", "run_id": run_id}).encode()),
                ):
                    frame = await to_a.request(kind, body, 10)
                    assert frame.kind is Kind.NOT_LEADER, (kind, frame)
            await to_a.close()

            # 4. Everything A appended after resuming is folded (a record on every partition,
            # appended after A stood down, is committed past); A wrote nothing of its own.
            for run_id in runs.values():
                marker = await stack.commands.append(_first_of(reserved, run_id), timeout=10)
                await until(
                    functools.partial(_committed_past, stack, marker.partition, marker.offset),
                    timeout=15,
                    what=f"partition {marker.partition} committed past {marker.offset}",
                )
            assert (await stack.store.snapshot()).digest() == before.digest()
            ids = [e.event_id for e in sent]
            assert await history_count(isolated, ids) == dict.fromkeys(ids, 1)
            refolded = await refold_matches(stack, db, isolated, replicas)
            for event_id, verdict in {**answered_by_a, **answered_after}.items():
                assert refolded[event_id] == verdict, event_id
            assert b_proc.alive(), b_proc.output()[-3000:]
            assert set((await db.lock_owners()).values()) == {b_proc.pid}
            assert set((await port.directory.leaders()).values()) == {b_address}, (
                "the zombie moved the registration"
            )
    finally:
        print(f"\nthe resumed zombie answered its queued requests with {zombie_line}")
        procs.close()
        await db.close()


async def _all_verdicts(stack: LedgerStack, ids: list[uuid.UUID]) -> bool:
    return len(await stack.store.verdicts(ids)) == len(ids)


async def _other_leader(port: LeaderPort, partitions: int, address: str) -> str | None:
    found = set((await port.directory.leaders()).values())
    if len(found) == 1 and None not in found and address not in found:
        return str(found.pop())
    return None


async def _committed_past(stack: LedgerStack, partition: int, offset: int) -> bool:
    state = await stack.store.partition_state(partition)
    return state is not None and state.next_offset > offset


def _first_of(reserved: list[CallReserved], run_id: str) -> CallReserved:
    return next(r for r in reserved if r.run_id == run_id)
