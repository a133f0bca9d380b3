"""Projector processes dying, freezing and racing, against real Kafka and PostgreSQL.

Every projector here is `python -m toolledger projector` in its own OS process, started,
frozen (SIGSTOP), resumed and killed by pid through `tests.integration.procs`. The test process
appends with a `LedgerStack` that runs no projector, and inspects PostgreSQL directly: which
session holds which partition's advisory lock (`pg_locks` joined with the session's
`application_name`, `toolledger-locks-<pid>`), which backend belongs to which process (its
client port), and the stored offsets. Every wait is a polled condition with a deadline.

What every test ends with, because it is what "exactly once" means: every appended event_id
has exactly one history row and one verdict, and the ledger equals a from-scratch re-fold of
the topic (`replay` into a fresh schema up to the live offsets: same rows, history and digest).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests import builders as b
from tests.integration.procs import Proc, Procs, toolledger_env, until
from tests.isolated import Isolated
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.projections.ownership import lock_class
from toolledger.projections.postgres import SMALL_BATCH, PostgresLedger
from toolledger.projections.replay import compare, replay
from toolledger.projections.store import LedgerStore
from toolledger.projections.verdicts import PostgresNotifications, VerdictSource, VerdictWaiter
from toolledger.settings import ProjectorSettings as Settings
from toolledger.wiring.commands import LedgerCommands
from toolledger.wiring.stack import LedgerStack

PARTITIONS = 4
#: What a projector process takes to import, connect, check the log identity and take locks.
START_TIMEOUT = 15.0
#: docs/architecture.md: "another process takes the partitions within a second"; asserted with slack
#: for a loaded two-core CI machine.
FAILOVER_LIMIT = 5.0


@dataclass
class Scene:
    """One test's ledger: settings, a projector-less client stack, an inspection connection."""

    settings: Settings
    env: dict[str, str]
    client: LedgerStack
    db: asyncpg.Connection[asyncpg.Record]
    procs: Procs
    schema: str

    async def lock_owners(self) -> dict[int, int]:
        """partition -> OS pid of the projector whose lock session holds it."""
        rows = await self.db.fetch(
            "SELECT l.objid::int AS partition, a.application_name FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.classid::bigint = $1::bigint "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            lock_class(self.schema),
        )
        return {
            int(r["partition"]): int(r["application_name"].removeprefix("toolledger-locks-"))
            for r in rows
        }

    async def offsets(self) -> dict[int, int]:
        rows = await self.db.fetch("SELECT partition, next_offset FROM projection_offsets")
        return {int(r["partition"]): int(r["next_offset"]) for r in rows}

    async def lock_session(self, proc: Proc) -> int | None:
        """The server pid of `proc`'s advisory-lock session."""
        pid = await self.db.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            f"toolledger-locks-{proc.pid}",
        )
        return None if pid is None else int(pid)

    async def batch_transaction(self, proc: Proc) -> asyncpg.Record | None:
        """`proc`'s session that is inside a batch transaction past its offset compare-and-set
        (it holds a row lock on projection_offsets), with its state; None if there is none.

        The table lock alone does not say the CAS ran: PostgreSQL takes it when the statement
        is parsed, and a client frozen between asyncpg's prepare and its execute holds it with
        no row locked (seen once: the other projector's CAS then never waited). The CAS is the
        batch transaction's first write, so a transaction id (`backend_xid`, assigned on the
        first write) says it updated the row, and holds its lock to the end."""
        return await self.db.fetchrow(
            "SELECT a.pid, a.state, a.wait_event FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.relation = 'projection_offsets'::regclass AND l.mode = 'RowExclusiveLock' "
            "AND l.granted AND a.backend_xid IS NOT NULL AND a.client_port = ANY($1::int[])",
            sorted(proc.local_ports()),
        )

    async def terminate(self, backend: int) -> None:
        """pg_terminate_backend, then wait until the session is gone (its locks are free)."""
        assert await self.db.fetchval("SELECT pg_terminate_backend($1)", backend)

        async def gone() -> bool:
            row = await self.db.fetchval("SELECT 1 FROM pg_stat_activity WHERE pid = $1", backend)
            return row is None

        await until(gone, timeout=5, what=f"backend {backend} to end")

    def start_projector(self, name: str) -> Proc:
        """`python -m toolledger projector` on this test's schema and topics."""
        return self.procs.projector(name, self.env)

    async def owns_all(self, proc: Proc) -> None:
        async def check() -> bool:
            return set((await self.lock_owners()).items()) == {
                (p, proc.pid) for p in range(PARTITIONS)
            }

        await until(check, timeout=START_TIMEOUT, what=f"{proc.name} to own every partition")

    async def verdicts_of(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        return await self.client.store.verdicts(event_ids)

    async def all_decided(self, event_ids: Sequence[uuid.UUID], timeout: float) -> None:
        async def check() -> bool:
            return len(await self.verdicts_of(event_ids)) == len(event_ids)

        try:
            await until(check, timeout=timeout, what=f"verdicts for all {len(event_ids)} events")
        except AssertionError as timed_out:
            # Say where the projectors were, so a timeout seen once in CI can be explained.
            missing = len(event_ids) - len(await self.verdicts_of(event_ids))
            offsets = await self.db.fetch("SELECT partition, next_offset FROM projection_offsets")
            tails = "".join(
                f"\n--- {proc.name} (pid {proc.pid}, exit {proc.returncode}), last lines:\n"
                + "\n".join(proc.output().splitlines()[-25:])
                for proc in self.procs.started
            )
            raise AssertionError(
                f"{timed_out}; {missing} without a verdict; offsets "
                f"{sorted((r['partition'], r['next_offset']) for r in offsets)}{tails}"
            ) from None

    async def assert_exactly_once(self, event_ids: Sequence[uuid.UUID]) -> None:
        """Each appended event_id has one history row and one verdict, and all were accepted
        (a second application of a reservation or completion would have been rejected)."""
        history = await self.db.fetch("SELECT event_id, accepted FROM tool_execution_history")
        verdicts = await self.db.fetch("SELECT event_id, accepted FROM verdicts")
        assert len(history) == len(set(event_ids)) == len(event_ids)
        assert {r["event_id"] for r in history} == set(event_ids)
        assert len(verdicts) == len(event_ids)
        assert {r["event_id"] for r in verdicts} == set(event_ids)
        rejected = [r["event_id"] for r in history if not r["accepted"]]
        assert rejected == [], f"{len(rejected)} events rejected, e.g. {rejected[:3]}"

    async def assert_equals_refold(self) -> str:
        """The live ledger equals a re-fold of the topic from offset 0 (rows, history, digest).

        Call when nothing is left to project: the live offsets are the replay's targets, and
        they are checked unchanged after the comparison.
        """
        targets = await self.offsets()
        assert self.settings.database_url is not None
        fresh = PostgresLedger(
            self.settings.database_url, f"{self.schema}_refold", verify_keys=b.KEYS
        )
        await fresh.start()
        try:
            report = await replay(self.client.events, fresh, targets=targets)
            replayed = await fresh.snapshot()
        finally:
            await fresh.close()
        live = await self.client.store.snapshot()
        assert await self.offsets() == targets, "the ledger moved during the comparison"
        assert compare(live, replayed) == []
        assert report.replay_digest == live.digest()
        return report.replay_digest


@pytest.fixture
async def scene(
    isolated: Isolated, pg_dsn: str, pg_schema: str, tmp_path: Path
) -> AsyncIterator[Scene]:
    settings = isolated.settings(Settings, partitions=PARTITIONS, verify_keys=b.KEYS)
    env = toolledger_env(settings)
    procs = Procs(tmp_path)
    client = await LedgerStack.connect(settings, run_projector=False, create_schema=True)
    db = await asyncpg.connect(pg_dsn, server_settings={"search_path": f'"{pg_schema}"'})
    try:
        yield Scene(settings, env, client, db, procs, pg_schema)
    finally:
        procs.close()
        await client.close()
        await db.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}_refold" CASCADE')
        await db.close()


@dataclass
class Stream:
    """Reservations and their completions for many runs, appended from this process at a pace.

    Each run appends `reserved`, then `completed` once Kafka acknowledged the reservation, call
    after call: a run's events are in log order, so a correct ledger accepts every one of them.
    """

    commands: LedgerCommands
    runs: int
    calls: int
    rate: float
    tag: str = "run"
    appended: list[uuid.UUID] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.runs * self.calls * 2

    async def run(self) -> None:
        gap = self.runs / self.rate

        async def one(i: int) -> None:
            await asyncio.sleep(gap * i / self.runs)
            for c in range(self.calls):
                reserved = b.reserved(f"{self.tag}{i}", f"c{c}")
                for event in (reserved, b.completed(reserved)):
                    await self.commands.append(event, timeout=10)
                    self.appended.append(event.event_id)
                    await asyncio.sleep(gap)

        await asyncio.gather(*(one(i) for i in range(self.runs)))


async def _settle(scene: Scene, proc: Proc) -> list[asyncpg.Record]:
    """The sessions of a frozen `proc`, once none is still running a statement it already sent.

    A frozen client sends nothing more, so a session ends up idle, idle in transaction, or
    active but waiting to read from the client (a COPY in the middle of its data).
    """

    async def settled() -> list[asyncpg.Record] | None:
        rows = await scene.db.fetch(
            "SELECT pid, state, wait_event, xact_start IS NOT NULL AS in_transaction "
            "FROM pg_stat_activity WHERE client_port = ANY($1::int[])",
            sorted(proc.local_ports()),
        )
        busy = [r for r in rows if r["state"] == "active" and r["wait_event"] != "ClientRead"]
        return None if busy or not rows else rows

    return await until(settled, timeout=5, what=f"the sessions of frozen {proc.name} to settle")


async def _appended_beyond(appended: Callable[[], int], target: int) -> None:
    await until(lambda: appended() >= target, timeout=10, what="a backlog")


async def _freeze(
    scene: Scene, proc: Proc, *, in_batch: bool, appended: Callable[[], int] = lambda: 0
) -> asyncpg.Record | None:
    """SIGSTOP `proc` at a moment it is inside a batch transaction past its offset
    compare-and-set (`in_batch`), or has no transaction open at all; retried until caught so.

    Only a batch of more than `SMALL_BATCH` events is applied in a transaction that spans round
    trips; a smaller one is a single statement, which a client frozen after sending it cannot
    hold open. So `in_batch` first lets a backlog build (`proc` frozen while the stream, counted
    by `appended`, appends a few large batches' worth), then catches `proc` working it off.
    Returns the open batch transaction's session when `in_batch`.
    """
    deadline = time.monotonic() + 10
    caught_since = time.monotonic()
    while time.monotonic() < deadline:
        if in_batch and time.monotonic() - caught_since > 0.5:
            proc.freeze()
            try:
                await _appended_beyond(appended, appended() + PARTITIONS * (SMALL_BATCH + 16))
            finally:
                proc.resume()
            caught_since = time.monotonic()
        if in_batch and await scene.batch_transaction(proc) is None:
            continue
        proc.freeze()
        sessions = await _settle(scene, proc)
        batch = await scene.batch_transaction(proc)
        if in_batch and batch is not None:
            return batch
        if not in_batch and not any(r["in_transaction"] for r in sessions):
            return None
        proc.resume()
        await asyncio.sleep(0.003 if in_batch else 0.017)
    where = "inside" if in_batch else "outside"
    raise AssertionError(f"could not freeze {proc.name} {where} a batch transaction")


@pytest.mark.parametrize("ownership", ["standby", "share"])
async def test_a_killed_projectors_partitions_move_to_the_survivor_and_nothing_is_applied_twice(
    scene: Scene, ownership: str
) -> None:
    """A projector SIGKILLed in the middle of a stream (inside a batch transaction when it can
    be caught there) must hand its partitions to the other process within seconds, and the
    survivor must neither skip nor re-apply anything the dead one committed: afterwards every
    event_id has one history row and one verdict and the ledger equals a re-fold of the topic.
    With shared ownership the second process first takes half the partitions from the first.

    Prints the failover time: SIGKILL -> the survivor holds the victim's partition locks, and
    SIGKILL -> every one of those partitions' stored offsets moved again.
    """
    scene.env["TOOLLEDGER_PROJECTOR_OWNERSHIP"] = ownership
    first = scene.start_projector("projector-1")
    await scene.owns_all(first)
    second = scene.start_projector("projector-2")

    async def all_owned() -> bool:
        owners = list((await scene.lock_owners()).values())
        if ownership == "share":
            return owners.count(first.pid) == owners.count(second.pid) == PARTITIONS // 2
        return len(owners) == PARTITIONS

    await until(all_owned, timeout=START_TIMEOUT, what="every partition to have an owner")
    stream = Stream(scene.client.commands, runs=100, calls=20, rate=700)
    appending = asyncio.create_task(stream.run())
    try:
        await until(
            lambda: len(stream.appended) >= stream.total // 5, timeout=10, what="the stream"
        )
        owners = await scene.lock_owners()
        by_pid = {first.pid: first, second.pid: second}
        victim = max(by_pid.values(), key=lambda p: list(owners.values()).count(p.pid))
        survivor = second if victim is first else first
        taken = sorted(p for p, pid in owners.items() if pid == victim.pid)
        mid_batch = None
        catch_until = time.monotonic() + 1
        while mid_batch is None and time.monotonic() < catch_until:
            mid_batch = await scene.batch_transaction(victim)
        victim.kill()
        killed = time.monotonic()

        async def survivor_holds() -> bool:
            owners = await scene.lock_owners()
            return all(owners.get(p) == survivor.pid for p in taken)

        await until(survivor_holds, timeout=10, what="the survivor's locks", interval=0.005)
        locked = time.monotonic()
        base = await scene.offsets()

        async def moved() -> bool:
            now = await scene.offsets()
            return all(now[p] > base[p] for p in taken)

        await until(moved, timeout=10, what="the victim's partitions to move", interval=0.005)
        resumed = time.monotonic()
        assert not appending.done(), "the stream ended before the failover could be measured"
        print(
            f"\nfailover of partitions {taken} ({'inside' if mid_batch else 'between'} a batch "
            f"transaction): locks {locked - killed:.3f}s, offsets moving {resumed - killed:.3f}s"
        )
        await appending
    finally:
        appending.cancel()
    assert resumed - killed < FAILOVER_LIMIT
    await scene.all_decided(stream.appended, timeout=15)
    await scene.assert_exactly_once(stream.appended)
    await scene.assert_equals_refold()
    assert survivor.alive(), survivor.output()[-3000:]
    assert set((await scene.lock_owners()).values()) == {survivor.pid}


_STOOD_DOWN = r"lost the partition locks|another projector took this partition over"


@pytest.mark.parametrize("frozen", ["between_batches", "inside_a_batch"])
async def test_a_frozen_projector_whose_partitions_were_taken_over_writes_nothing_on_resuming(
    scene: Scene, frozen: str
) -> None:
    """A projector frozen (SIGSTOP) while events flow, whose lock session PostgreSQL then drops,
    must write nothing when it resumes (SIGCONT) after another projector took its partitions:
    a zombie that re-applied the batch it held would double events or fork the ledger.

    Proven, in order:
    1. A owns every partition, B runs as its hot standby, and A is frozen mid-stream, either
       with no transaction open (`between_batches`: it may hold fetched records) or inside a
       batch transaction past its offset compare-and-set (`inside_a_batch`). Its lock session
       is terminated; B takes every partition lock.
    2. `inside_a_batch` only: B cannot apply over the range A's open transaction claimed: B's
       compare-and-set waits on A's row lock (`pg_blocking_pids`). Then A's batch session is
       terminated too (PostgreSQL dropping the hung client), which rolls A's batch back and
       lets B go on. PostgreSQL would end it by itself once it has been idle in transaction
       for 10 s (the store's `idle_in_transaction_session_timeout`), so B is a standby started
       beforehand: its compare-and-set must reach A's row lock well inside that, which a
       projector process started only now cannot promise on a loaded machine. A batch session
       caught in a COPY is not idle and is never ended that way; if it were left open, A would
       commit that one batch when it resumes (its compare-and-set had passed; B's then misses
       and re-seeks, so no event is applied twice). This test does not cover that case.
    3. B applies every event appended so far (one verdict each). The ledger is snapshotted.
    4. A resumes. Its output shows that it stood down (lock lost, or its compare-and-set
       missed) or, when its batch session was dropped, that it exited; while it does so, the
       ledger (records, runs, history, digest) and the offsets stay exactly the snapshot: B has
       nothing to apply, so any change would be A's write.
    5. More events are appended; B alone holds the locks and applies them, and A, if alive,
       owns nothing. Every event_id has one history row and one verdict, all accepted, and
       the ledger equals a re-fold of the topic.
    """
    a = scene.start_projector("projector-a")
    await scene.owns_all(a)
    b_proc = scene.start_projector("projector-b")
    await b_proc.wait_for(r"owns \[\];", timeout=START_TIMEOUT)
    stream = Stream(scene.client.commands, runs=40, calls=20, rate=500, tag="before")
    appending = asyncio.create_task(stream.run())
    try:
        await until(lambda: len(stream.appended) >= 100, timeout=10, what="the stream")
        batch = await _freeze(
            scene, a, in_batch=frozen == "inside_a_batch", appended=lambda: len(stream.appended)
        )
        lock_session = await scene.lock_session(a)
        assert lock_session is not None
        await scene.terminate(lock_session)
        if batch is None:
            await scene.owns_all(b_proc)
        else:
            # Looked for from here, not after B reports owning everything: PostgreSQL ends A's
            # batch session 10 s after A froze (idle in transaction), and on a loaded machine
            # the wait for B's status line used up enough of that for B's compare-and-set to
            # reach the row lock only after it was released (seen once in CI). B waiting on A
            # already proves B took the partition.
            waiting = (
                "SELECT a.pid FROM pg_stat_activity a WHERE a.client_port = ANY($1::int[]) "
                "AND $2 = ANY(pg_blocking_pids(a.pid))"
            )

            async def b_waits_on_a() -> object:
                return await scene.db.fetchval(waiting, sorted(b_proc.local_ports()), batch["pid"])

            try:
                await until(
                    b_waits_on_a, timeout=10, what="B's compare-and-set to wait on A's batch"
                )
            except AssertionError as timed_out:
                # Say where both were, so a timeout seen once in CI can be explained.
                session = await scene.db.fetchrow(
                    "SELECT state, wait_event, now() - state_change AS idle, query "
                    "FROM pg_stat_activity WHERE pid = $1",
                    batch["pid"],
                )
                raise AssertionError(
                    f"{timed_out}; A's batch session now: {dict(session) if session else 'gone'}"
                    f"; B (pid {b_proc.pid}) alive: {b_proc.alive()}, last lines:\n"
                    + "\n".join(b_proc.output().splitlines()[-30:])
                ) from None
            await scene.terminate(batch["pid"])
            await scene.owns_all(b_proc)
        await appending
    finally:
        appending.cancel()
    await scene.all_decided(stream.appended, timeout=15)
    before = await scene.client.store.snapshot()
    offsets = await scene.offsets()

    mark = a.mark()
    a.resume()
    await until(
        lambda: not a.alive() or re.search(_STOOD_DOWN, a.output()[mark:]),
        timeout=10,
        what="the resumed projector A to stand down or exit",
    )
    if a.alive():
        await a.wait_for(r"owns \[\];", timeout=5, after=a.mark())
    outcome = re.findall(f"{_STOOD_DOWN}|Traceback|Error: .*", a.output()[mark:])
    print(f"\nzombie frozen {frozen.replace('_', ' ')}: after SIGCONT it logged {outcome[:3]}")
    assert (await scene.client.store.snapshot()).digest() == before.digest()
    assert await scene.offsets() == offsets

    more = Stream(scene.client.commands, runs=10, calls=5, rate=500, tag="after")
    await more.run()
    await scene.all_decided(more.appended, timeout=15)
    assert set((await scene.lock_owners()).values()) == {b_proc.pid}
    if a.alive():
        await a.wait_for(r"owns \[\];", timeout=5, after=a.mark())
    await scene.assert_exactly_once(stream.appended + more.appended)
    await scene.assert_equals_refold()


class _StoreVerdicts(VerdictSource):
    def __init__(self, store: LedgerStore) -> None:
        self._store = store

    async def verdicts(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Verdict]:
        return await self._store.verdicts(event_ids)


@pytest.mark.parametrize("wiring", ["stack", "hints_only"])
async def test_a_waiter_whose_listen_connection_is_killed_mid_wait_still_gets_its_verdict(
    scene: Scene, wiring: str
) -> None:
    """Killing the process's LISTEN session while a waiter waits must not lose the verdict nor
    leave the listener dead (every later waiter would then depend on the 50 ms poll alone).

    `stack`: the client stack's own waiter and listener (`_listeners[0]`), as runtimes use them.
    `hints_only`: a waiter whose timer poll is 60 s, longer than the wait: the verdict can only
    arrive through a notification on the re-established LISTEN session, which proves the
    listener reconnected *and* listens again, not merely that polling covers for it.
    The projector starts only after the LISTEN backend was terminated and replaced.
    """
    store = scene.client.store
    assert isinstance(store, PostgresLedger)
    if wiring == "stack":
        waiter, listener = scene.client.waiter, scene.client._listeners[0]
        commands = scene.client.commands
    else:
        assert scene.settings.database_url is not None
        waiter = VerdictWaiter(_StoreVerdicts(store), poll_interval=60)
        listener = PostgresNotifications(scene.settings.database_url, store.notify_channel, waiter)
        await listener.start()
        commands = LedgerCommands(scene.client.events, waiter)
    try:
        event = b.reserved("listen-run", "c1")
        waiting = asyncio.create_task(commands.append_and_await(event, timeout=15))
        await until(
            lambda: event.event_id in waiter._pending, timeout=10, what="the waiter to wait"
        )
        killed = listener.backend_pid
        assert killed is not None
        await scene.terminate(killed)
        await until(
            lambda: listener.reconnects >= 1 and listener.backend_pid not in (None, killed),
            timeout=10,
            what="the listener to reconnect",
        )
        assert not waiting.done()
        listening = await scene.db.fetchval(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1", listener.backend_pid
        )
        assert listening == f"toolledger-listen-{os.getpid()}"
        scene.start_projector("projector")
        verdict = await waiting
        assert verdict.event_id == event.event_id
        assert verdict.accepted, verdict.detail
        assert listener.reconnects == 1
    finally:
        if wiring != "stack":
            await waiter.close()
            await listener.close()


async def test_waiters_pending_when_their_projector_is_killed_get_verdicts_from_the_survivor(
    scene: Scene,
) -> None:
    """Runtimes waiting on reservation verdicts when the projector owning their partitions is
    SIGKILLed must get those verdicts from the standby projector, well within their timeout,
    not a `LedgerUnavailable` that would make them report a call not attempted.

    Deterministic "pending": A is frozen before the waiters append, so nothing can decide their
    events until A is killed and B takes over. Prints kill -> last verdict.
    """
    a = scene.start_projector("projector-a")
    await scene.owns_all(a)
    standby = scene.start_projector("projector-b")
    await standby.wait_for(r"owns \[\];", timeout=START_TIMEOUT)
    commands = scene.client.commands
    warm = [b.reserved(f"warm{i}", "c1") for i in range(20)]
    assert all(v.accepted for v in await _await_all(commands, warm))

    a.freeze()
    events = [b.reserved(f"pending{i}", "c1") for i in range(200)]
    waiting = [asyncio.create_task(commands.append_and_await(e, timeout=15)) for e in events]
    await until(
        lambda: all(e.event_id in scene.client.waiter._pending for e in events),
        timeout=10,
        what="every waiter to have appended and be waiting",
    )
    assert not any(w.done() for w in waiting)
    a.kill()
    killed = time.monotonic()
    verdicts = await asyncio.gather(*waiting)
    print(f"\n{len(events)} pending waiters: kill -> last verdict {time.monotonic() - killed:.3f}s")
    assert [v.event_id for v in verdicts] == [e.event_id for e in events]
    assert all(v.accepted for v in verdicts)
    assert set((await scene.lock_owners()).values()) == {standby.pid}
    await scene.assert_exactly_once([e.event_id for e in warm + events])
    await scene.assert_equals_refold()


async def _await_all(commands: LedgerCommands, events: Sequence[Event]) -> list[Verdict]:
    return list(await asyncio.gather(*(commands.append_and_await(e, 10) for e in events)))


async def test_two_processes_reserving_one_key_at_once_get_exactly_one_acceptance(
    scene: Scene,
) -> None:
    """Two OS processes reserving the same call key at the same instant must not both be told
    to run the tool: exactly one reservation is accepted, the other is rejected as `held`, and
    the ledger's record names the winner's reservation."""
    projector = scene.start_projector("projector")
    await scene.owns_all(projector)
    workers = [
        scene.procs.python(
            f"worker-{i}",
            "tests.integration.append_worker",
            "--run",
            "race",
            "--call",
            "c1",
            env=scene.env,
            stdin=subprocess.PIPE,
        )
        for i in (1, 2)
    ]
    for worker in workers:
        await worker.wait_for(r"(?m)^ready$", timeout=START_TIMEOUT)
    for worker in workers:
        assert worker.popen.stdin is not None
        worker.popen.stdin.write(b"go\n")
        worker.popen.stdin.flush()
    for worker in workers:
        assert await worker.wait_exit(timeout=20) == 0, worker.output()
    results = [_verdict_line(w) for w in workers]
    assert {r["pid"] for r in results} == {w.pid for w in workers}
    winners = [r for r in results if r["accepted"]]
    losers = [r for r in results if not r["accepted"]]
    assert len(winners) == 1 and len(losers) == 1, results
    assert losers[0]["reason"] == "held", losers[0]
    record = await scene.client.store.get_call("race:c1")
    assert record is not None and record.status == "started"
    assert str(record.reservation_id) == winners[0]["reservation_id"]
    history = await scene.client.store.history("race:c1")
    assert [h.accepted for h in history] == [True, False]
    await scene.assert_equals_refold()


def _verdict_line(worker: Proc) -> dict[str, Any]:
    """The JSON verdict a worker printed last."""
    for line in reversed(worker.output().splitlines()):
        if line.startswith("{"):
            found: dict[str, Any] = json.loads(line)
            return found
    raise AssertionError(f"{worker.name} printed no verdict:\n{worker.output()}")


async def test_a_projector_does_not_log_aiokafkas_subscription_line_on_each_identity_check(
    scene: Scene,
) -> None:
    """The projector logged aiokafka's "Updating subscribed topics" at every identity check
    (each one assigns a fresh consumer), every 2 s forever; its own lines must remain."""
    scene.env["TOOLLEDGER_IDENTITY_CHECK_S"] = "0.2"
    proc = scene.start_projector("projector-quiet")
    await scene.owns_all(proc)
    start = proc.mark()
    for _ in range(5):  # status lines come every 0.2 s: at least a second of identity checks
        start = (await proc.wait_for(r"owns \[", timeout=START_TIMEOUT, after=start)).end()
    assert "took partition" in proc.output()
    assert "Updating subscribed topics" not in proc.output()


async def test_a_projector_process_does_not_listen_to_its_own_notifications(scene: Scene) -> None:
    """`toolledger projector` waits for no verdict: a LISTEN session of its own would only
    bring every notification it sends back to it as a wake-up for nothing (decision 4 of the
    lean event path). Runtimes keep theirs: the client's verdicts still arrive."""
    proc = scene.start_projector("projector")
    await scene.owns_all(proc)
    verdict = await scene.client.commands.append_and_await(b.reserved("quiet", "c1"), timeout=15)
    assert verdict.accepted, verdict.detail
    names = {
        r["application_name"]
        for r in await scene.db.fetch("SELECT application_name FROM pg_stat_activity")
    }
    assert f"toolledger-locks-{proc.pid}" in names
    assert f"toolledger-listen-{proc.pid}" not in names
    assert f"toolledger-listen-{os.getpid()}" in names
