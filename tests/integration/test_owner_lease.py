"""A hung owner gives up its partitions by itself: the lease, on real processes.

Projector processes with a short lease (`TOOLLEDGER_OWNER_LEASE_S`, `LEASE_S` here) own one
test's partitions; a runtime in this process makes tool calls through their leaders
(`TOOLLEDGER_LEADER=auto`) with a tool that counts its effects. Nothing here ends a server
session by hand: the owner is frozen (SIGSTOP), or its event loop blocked by a synchronous
sleep inside a batch, and PostgreSQL's bound on its lock session (`idle_session_timeout`) is
what frees its partitions for the standby. Each test then wakes the owner and checks that it
stands down: it writes nothing and answers nothing but `NOT_LEADER`.

What every test ends with: each call's tool ran once and its key holds one reservation and one
outcome, both accepted, and the ledger equals a re-fold of the log. Every process started is
stopped by its pid (`Procs.close`).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests import builders as b
from tests.api_support import METRICS_AUTH, api_settings, client
from tests.integration.leader_support import (
    all_led,
    freeze_between_batches,
    leader_settings,
    owns_every_partition,
    refold_matches,
)
from tests.integration.leader_worker import BLOCKING_RUN
from tests.integration.procs import Proc, Procs, toolledger_env, until
from tests.isolated import Isolated, running_stack
from toolledger import Ledger, ToolContext, Toolset, external
from toolledger.api import create_app
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.events.codec import encode
from toolledger.events.log import partition_for
from toolledger.leader.projector_side.reads import LeaderReads
from toolledger.leader.runtime_side.connection import LeaderConnection, LeaderDirectory
from toolledger.leader.runtime_side.frames import Kind
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.settings import ProjectorSettings
from toolledger.wiring.leader import StackLeaderPort
from toolledger.wiring.leader_index import RegisteredLeaders
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

#: The owners' lease in these tests (the default is 10 s).
LEASE_S = 3.0
#: The issue's bound: the standby owns every partition within the lease plus this.
TAKEOVER_SLACK_S = 3.0
#: The runtime's `TOOLLEDGER_LEADER_TIMEOUT_MS`.
BOUND_MS = 500
#: What a projector process takes to import, connect, check the log and take its locks.
START_TIMEOUT = 30.0
#: What a woken owner logs when it finds its lock session gone.
STOOD_DOWN = r"lost the partition locks|the lease lapsed"

effects: Counter[str] = Counter()
lease_tools = Toolset("lease")


@lease_tools.tool(external())
async def charge(n: int, context: ToolContext) -> int:
    """An external tool whose every run is an effect, counted by idempotency key."""
    effects[context.idempotency_key] += 1
    return n


class WatchedDirectory(LeaderDirectory):
    """The runtime's directory of leaders, noting when it first gave up on each partition's
    leader, and how long that leader had had the request by then."""

    def __init__(self, settings: ProjectorSettings) -> None:
        assert settings.database_url is not None
        super().__init__(
            RegisteredLeaders(LeaderReads(settings.database_url, settings.schema_name))
        )
        self.gave_up: dict[int, float] = {}
        self.waited: dict[int, float] = {}
        self._asked: dict[int, float] = {}

    async def connection(self, partition: int) -> LeaderConnection | None:
        connection = await super().connection(partition)
        if connection is not None:
            self._asked[partition] = time.monotonic()  # the request goes out on it now
        return connection

    def watch(self) -> None:
        """Forget what was noted so far (a loaded machine may have timed a live leader out)."""
        self.gave_up.clear()
        self.waited.clear()

    def failed(self, partition: int, why: str, unreachable: str | None = None) -> None:
        if partition not in self.gave_up:
            self.gave_up[partition] = time.monotonic()
            self.waited[partition] = self.gave_up[partition] - self._asked[partition]
        super().failed(partition, why, unreachable)


@dataclass
class Scene:
    """One test's ledger: projector processes, a runtime on the fast path, an inspection pool."""

    settings: ProjectorSettings
    env: dict[str, str]
    procs: Procs
    db: LedgerDB
    stack: LedgerStack
    port: LeaderPort
    directory: WatchedDirectory
    ledger: Ledger
    #: A run id of each partition, so every partition has calls.
    runs: dict[int, str]

    async def call_all(self, tag: str) -> list[str]:
        """One call of `charge` in every run at once; the keys, once each ran the tool once."""
        keys = [f"{run}:{tag}" for run in self.runs.values()]
        outcomes = await asyncio.gather(
            *(
                self.ledger.call(
                    charge, run_id=run, tool_call_id=tag, tenant_id="lease", arguments={"n": p}
                )
                for p, run in self.runs.items()
            )
        )
        for (p, _run), outcome in zip(self.runs.items(), outcomes, strict=True):
            assert outcome.value == p and not outcome.replayed, outcome
        return keys

    async def every_key_once(self, keys: list[str]) -> None:
        """Each key's tool ran once, and its history is one reservation and one completion."""
        await self.port.settled()
        for key in keys:
            history = await self.stack.store.history(key)
            assert [(h.event_type, h.accepted) for h in history] == [
                ("call_reserved", True),
                ("call_completed", True),
            ], (key, history)
            record = await self.stack.store.get_call(key)
            assert record is not None and record.status == "completed"
            assert effects[record.idempotency_key] == 1, key

    async def sessions(self, proc: Proc) -> Counter[str]:
        """How many PostgreSQL sessions `proc` has, by application name."""
        rows = await self.db.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1",
            f"toolledger-%-{proc.pid}",
        )
        return Counter(str(r["application_name"]) for r in rows)

    async def taken_over(self, by: Proc, since: float) -> float:
        """Seconds from `since` until `by` holds every partition lock."""
        await owns_every_partition(self.db, by, len(self.runs), timeout=LEASE_S * 5)
        return time.monotonic() - since

    async def stood_down(self, zombie: Proc, address: str, mark: int) -> None:
        """`zombie`, woken, logged that it lost its partitions, and answers only `NOT_LEADER`
        to appends (nothing appended) and reads for every partition."""
        await zombie.wait_for(STOOD_DOWN, timeout=START_TIMEOUT, after=mark)
        to_zombie = LeaderConnection(address)
        try:
            for run in self.runs.values():
                late = b.reserved(run, "late", tenant="lease")
                read = json.dumps({"key": f"{run}:late", "run_id": run}).encode()
                for kind, body in ((Kind.APPEND, encode(late)), (Kind.READ, read)):
                    frame = await to_zombie.request(kind, body, 10)
                    assert frame.kind is Kind.NOT_LEADER, (kind, frame)
        finally:
            await to_zombie.close()

    async def offsets(self) -> dict[int, int]:
        rows = await self.db.fetch("SELECT partition, next_offset FROM projection_offsets")
        return {int(r["partition"]): int(r["next_offset"]) for r in rows}


@asynccontextmanager
async def scene(isolated: Isolated, tmp_path: Path, partitions: int = 2) -> AsyncIterator[Scene]:
    settings = leader_settings(isolated, partitions=partitions, leader_timeout_ms=BOUND_MS)
    runs = {partition_for(f"r{i}", settings.partitions): f"r{i}" for i in range(50)}
    assert len(runs) == settings.partitions
    env = {**toolledger_env(settings), "TOOLLEDGER_OWNER_LEASE_S": str(LEASE_S)}
    effects.clear()  # the keys are the same in every test (each has a ledger of its own)
    procs = Procs(tmp_path)
    db = LedgerDB(isolated.database_url, isolated.schema)
    try:
        async with running_stack(settings, run_projector=False) as stack:
            directory = WatchedDirectory(settings)
            port = StackLeaderPort(
                StackPort(stack), directory, settings.partitions, BOUND_MS / 1000
            )
            ledger = Ledger(port, verdict_timeout=30.0)
            try:
                yield Scene(settings, env, procs, db, stack, port, directory, ledger, runs)
            finally:
                await port.close()
    finally:
        procs.close()
        await db.close()


async def _leader_address(port: LeaderPort, partitions: int) -> str:
    addresses = set((await all_led(port, partitions)).values())
    assert len(addresses) == 1, addresses
    return str(addresses.pop())


async def _new_leader(s: Scene, old: str) -> str:
    """B's address, once the runtime's calls are answered by B's leader on every partition."""

    async def registered() -> str | None:
        found = set((await s.directory.leaders()).values())
        return str(found.pop()) if len(found) == 1 and not found & {None, old} else None

    address = await until(registered, timeout=START_TIMEOUT, what="a new leader registered")
    assert address != old
    return address


async def _answered_by_leader(s: Scene, tag: str) -> list[str]:
    """Calls in every run until a round of them is answered by a leader; their keys."""
    keys: list[str] = []
    for attempt in range(20):
        before = s.port.stats["leader"]
        keys += await s.call_all(f"{tag}{attempt}")
        if s.port.stats["leader"] - before >= 2 * len(s.runs):  # reservation and outcome
            return keys
        await asyncio.sleep(0.5)
    raise AssertionError(f"no round of calls answered by a leader: {s.port.stats}")


async def test_a_frozen_owner_loses_its_partitions_by_its_lease_and_writes_nothing_woken(
    isolated: Isolated, tmp_path: Path, replicas: list[str]
) -> None:
    """An owner frozen with SIGSTOP kept its lock session, and so its partitions, until
    someone ended its sessions by hand: the standby never took over. Now PostgreSQL ends that
    one session at the lease (none of the owner's other sessions is touched), the standby owns
    every partition within the lease plus its retry interval, the runtime gives up on the
    frozen leader within its bound, and the calls made during the freeze complete on the new
    owner with one effect each; the runtime then follows the new leader. Woken, the old owner
    stands down: it writes nothing (the ledger and offsets stay as they were) and answers
    nothing but NOT_LEADER."""
    async with scene(isolated, tmp_path) as s:
        parts = s.settings.partitions
        a = s.procs.projector("owner-a", s.env)
        await owns_every_partition(s.db, a, parts, timeout=START_TIMEOUT)
        b_proc = s.procs.projector("standby-b", s.env)
        await b_proc.wait_for(r"owns \[\];", timeout=START_TIMEOUT)
        a_address = await _leader_address(s.port, parts)
        keys = await _answered_by_leader(s, "before")
        await s.port.settled()

        await freeze_between_batches(s.db, a)
        frozen = time.monotonic()
        s.directory.watch()
        sessions = await s.sessions(a)
        during = asyncio.create_task(s.call_all("frozen"))
        took = await s.taken_over(b_proc, since=frozen)
        left = await s.sessions(a)
        keys += await during
        print(f"\nfrozen owner, lease {LEASE_S:g}s: freeze -> the standby owns every partition "
              f"{took:.2f}s; the runtime gave up on the frozen leader after "
              f"{max(s.directory.waited.values()):.2f}s")  # fmt: skip
        assert took <= LEASE_S + TAKEOVER_SLACK_S
        locks = Counter({f"toolledger-locks-{a.pid}": 1})
        assert sessions & locks == locks, sessions
        assert left == sessions - locks, "only the lock session may end, by the lease"
        assert sorted(s.directory.gave_up) == sorted(s.runs)
        # It gave up on the frozen leader after its bound, long before the lease ran out (the
        # second of slack is for a loaded machine's timers, not for the leader).
        gave_up = {p: t - frozen for p, t in s.directory.gave_up.items()}
        assert all(0 < t < took for t in gave_up.values()), (took, gave_up, s.directory.waited)
        bound, waited = BOUND_MS / 1000, s.directory.waited
        assert all(bound - 0.01 <= w < bound + 1.0 for w in waited.values()), waited

        b_address = await _new_leader(s, a_address)
        keys += await _answered_by_leader(s, "after")
        assert set((await s.directory.leaders()).values()) == {b_address}
        await s.every_key_once(keys)
        before, offsets = await s.stack.store.snapshot(), await s.offsets()

        mark = a.mark()
        a.resume()
        await s.stood_down(a, a_address, mark)
        assert (await s.stack.store.snapshot()).digest() == before.digest()
        assert await s.offsets() == offsets
        assert set((await s.db.lock_owners()).values()) == {b_proc.pid}
        keys += await s.call_all("woken")
        await s.every_key_once(keys)
        await refold_matches(s.stack, s.db, isolated, replicas)
        assert b_proc.alive(), b_proc.output()[-3000:]


async def test_a_frozen_sharing_projectors_partitions_go_to_the_other_by_its_lease(
    isolated: Isolated, tmp_path: Path, replicas: list[str]
) -> None:
    """With the partitions shared, a frozen member kept its half (and its member lock, so the
    other never counted it gone). Its lease ends its lock session: the other projector counts
    one member and takes every partition within the lease plus its retry interval, calls made
    meanwhile complete with one effect each, and the frozen member, woken, stands down and
    then takes its share again."""
    async with scene(isolated, tmp_path) as s:
        env = {**s.env, "TOOLLEDGER_PROJECTOR_OWNERSHIP": "share"}
        first = s.procs.projector("member-1", env)
        await owns_every_partition(s.db, first, len(s.runs), timeout=START_TIMEOUT)
        second = s.procs.projector("member-2", env)

        async def halves() -> bool:
            return sorted((await s.db.lock_owners()).values()) == sorted([first.pid, second.pid])

        await until(halves, timeout=START_TIMEOUT, what="the partitions shared one each")
        keys = await _answered_by_leader(s, "before")
        await s.port.settled()

        await freeze_between_batches(s.db, first)
        frozen = time.monotonic()
        during = asyncio.create_task(s.call_all("frozen"))
        took = await s.taken_over(second, since=frozen)
        keys += await during
        print(f"\nfrozen sharing member, lease {LEASE_S:g}s: freeze -> the other owns every "
              f"partition {took:.2f}s")  # fmt: skip
        assert took <= LEASE_S + TAKEOVER_SLACK_S

        mark = first.mark()
        first.resume()
        await first.wait_for(STOOD_DOWN, timeout=START_TIMEOUT, after=mark)
        await until(halves, timeout=START_TIMEOUT, what="the woken member to take its share")
        keys += await s.call_all("shared")
        await s.every_key_once(keys)
        await refold_matches(s.stack, s.db, isolated, replicas)


async def test_an_owner_whose_loop_is_blocked_past_its_lease_loses_its_partitions_and_stands_down(
    isolated: Isolated, tmp_path: Path, replicas: list[str]
) -> None:
    """An owner whose event loop is blocked for twice its lease by a synchronous sleep inside
    a batch cannot renew, so PostgreSQL ends its lock session and the standby takes every
    partition within the lease plus its retry interval, while calls complete on it. Unblocked,
    the old owner finds its lease lapsed before writing the batch it was in, stands down and
    answers nothing but NOT_LEADER; the record it was folding is the new owner's to decide."""
    async with scene(isolated, tmp_path) as s:
        parts = s.settings.partitions
        env = {**s.env, "TOOLLEDGER_TEST_BLOCK_S": str(2 * LEASE_S)}
        a = s.procs.python("owner-a", "tests.integration.leader_worker", "blocks-loop", env=env)
        await a.wait_for("leading", timeout=START_TIMEOUT)
        b_proc = s.procs.projector("standby-b", s.env)
        await b_proc.wait_for(r"owns \[\];", timeout=START_TIMEOUT)
        a_address = await _leader_address(s.port, parts)
        keys = await _answered_by_leader(s, "before")

        mark = a.mark()
        blocking = b.reserved(BLOCKING_RUN, "c1", tenant="lease")
        await s.stack.commands.append(blocking, timeout=10)
        await a.wait_for("blocking", timeout=START_TIMEOUT, after=mark)
        blocked = time.monotonic()
        during = asyncio.create_task(s.call_all("blocked"))
        took = await s.taken_over(b_proc, since=blocked)
        assert "unblocked" not in a.output()[mark:], "the block ended before the takeover"
        keys += await during
        print(f"\nblocked owner, lease {LEASE_S:g}s: block -> the standby owns every partition "
              f"{took:.2f}s")  # fmt: skip
        assert took <= LEASE_S + TAKEOVER_SLACK_S

        await a.wait_for("unblocked", timeout=START_TIMEOUT, after=mark)
        await a.wait_for(r"the lease lapsed", timeout=START_TIMEOUT, after=mark)
        await s.stood_down(a, a_address, mark)
        verdict = await s.stack.commands.append_and_await(blocking, timeout=10)
        assert verdict.accepted, verdict
        await _new_leader(s, a_address)
        keys += await _answered_by_leader(s, "after")
        await s.every_key_once(keys)
        assert set((await s.db.lock_owners()).values()) == {b_proc.pid}
        await refold_matches(s.stack, s.db, isolated, replicas)


#: The throughput benchmark's load (`benchmarks/throughput.py`): runs in flight, and partitions.
LOAD_RUNS = 64
LOAD_PARTITIONS = 4
#: How long a healthy owner is watched under that load.
LOAD_S = 60.0


@pytest.mark.drill
@pytest.mark.timeout(LOAD_S + 240)
async def test_a_healthy_owner_under_the_64_way_load_never_loses_its_lease(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A lease renewed behind busy batches, or from a task the load starves, would be lost by
    a healthy owner: its standby would take the partitions in the middle of the work, each time
    a stall and a flurry of failed compare-and-sets. Under the throughput benchmark's load (64
    runs each calling a tool, one call after another, through the leaders) for a minute, the
    owner must keep its lock session, its lease rows must never look stale (two renewals
    missed), the standby must own nothing, and every call must have had one effect."""
    async with scene(isolated, tmp_path, partitions=LOAD_PARTITIONS) as s:
        a = s.procs.projector("owner-a", s.env, status_every=5.0)
        await owns_every_partition(s.db, a, LOAD_PARTITIONS, timeout=START_TIMEOUT)
        b_proc = s.procs.projector("standby-b", s.env, status_every=5.0)
        await b_proc.wait_for(r"owns \[\];", timeout=START_TIMEOUT)
        await _answered_by_leader(s, "warm")
        backend = await _lock_backend(s, a)
        stop = time.monotonic() + LOAD_S
        done = 0
        oldest = 0.0

        async def run(r: int) -> None:
            nonlocal done
            c = 0
            while time.monotonic() < stop:
                outcome = await s.ledger.call(
                    charge, run_id=f"load{r}", tool_call_id=f"c{c}", tenant_id="lease",
                    arguments={"n": r},
                )  # fmt: skip
                assert outcome.value == r and not outcome.replayed, outcome
                c += 1
                done += 1

        async def watch() -> None:
            nonlocal oldest
            while time.monotonic() < stop:
                leases = await s.stack.store.partition_leases()
                assert len(leases) == LOAD_PARTITIONS, leases
                oldest = max([oldest, *(lease.age_s for lease in leases)])
                assert not any(lease.stale for lease in leases), leases
                owners = await s.db.lock_owners()
                assert set(owners.values()) == {a.pid}, owners
                await asyncio.sleep(0.25)

        await asyncio.gather(watch(), *(run(r) for r in range(LOAD_RUNS)))
        print(f"\nhealthy owner under {LOAD_RUNS}-way load for {LOAD_S:g}s: {done} calls, "
              f"{done / LOAD_S:.0f}/s; oldest lease renewal seen {oldest:.2f}s "
              f"(lease {LEASE_S:g}s, renewed every {LEASE_S / 4:g}s)")  # fmt: skip
        assert await _lock_backend(s, a) == backend, "the owner's lock session was replaced"
        assert not re.search(STOOD_DOWN, a.output()), a.output()[-3000:]
        assert s.port.stats["leader"] > done  # the load went through the leaders
        loaded = [n for key, n in effects.items() if key.startswith("load")]
        assert len(loaded) == done and set(loaded) == {1}, "a call without one effect"


async def test_readyz_and_the_metrics_show_a_partition_whose_owner_stopped_renewing(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A frozen owner's partitions got no projection and nothing said so: `/readyz` stayed 200
    and no metric moved. With no standby to take over, the API's `/readyz` must turn 503 naming
    each partition, its owner and how long ago it renewed, once the owner missed two renewals
    and again once its lease ran out, and the metrics must show each partition's lease age and
    a stale flag. Woken, the owner finds its session gone, takes its partitions again, and
    `/readyz` is 200; the projector's own `/readyz` reports the leases beside its lag."""
    settings = isolated.settings(ProjectorSettings, verify_keys=b.KEYS)
    lease = 2.0
    env = {**toolledger_env(settings), "TOOLLEDGER_OWNER_LEASE_S": str(lease)}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        health_port = probe.getsockname()[1]
    procs = Procs(tmp_path)
    owner = procs.python(
        "owner", "toolledger", "projector", "--status-every", "0.2",
        "--health-port", str(health_port), env=env,
    )  # fmt: skip
    operator = api_settings(
        signing_keys=(b.SIGNING_KEY,), verify_keys=b.KEYS, **isolated.connection()
    )
    try:
        await owner.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT)
        async with (
            running_stack(settings, run_projector=False) as stack,
            client(create_app(stack, operator)) as api,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{health_port}") as own,
        ):
            ready = await api.get("/readyz")
            assert ready.status_code == 200, ready.text
            renewing = re.compile(rf"^\S+ pid {owner.pid}, renewed \d+\.\d+s ago \(lease 2s\)$")
            for checks in (ready.json()["checks"], (await own.get("/readyz")).json()["checks"]):
                assert renewing.match(checks["lease_partition_0"]), checks
                assert renewing.match(checks["lease_partition_1"]), checks
            assert _gauge(await _metrics(api), "stale", 0) == 0.0

            owner.freeze()

            async def not_ready(says: str) -> str | None:
                answer = await api.get("/readyz")
                message = str(answer.json().get("error", {}).get("message", ""))
                return message if answer.status_code == 503 and says in message else None

            stalled = await until(
                lambda: not_ready(f"pid {owner.pid}) has not renewed its lease for"),
                timeout=START_TIMEOUT,
                what="/readyz to say the owner stopped renewing",
            )
            for partition in (0, 1):
                assert re.search(
                    rf"partition {partition}: its owner \(\S+ pid {owner.pid}\) has not renewed "
                    r"its lease for \d+\.\d+s \(lease 2s\): it is stalled or frozen",
                    stalled,
                ), stalled
            text = await _metrics(api)
            assert _gauge(text, "stale", 0) == _gauge(text, "stale", 1) == 1.0
            assert _gauge(text, "age_seconds", 0) >= lease / 2
            expired = await until(
                lambda: not_ready("no projector has renewed its lease for"),
                timeout=START_TIMEOUT,
                what="/readyz to say the lease ran out and nobody took the partitions",
            )
            assert f"last owner {_host(stalled, owner)} pid {owner.pid}" in expired, expired
            await until(
                lambda: _lock_session_gone(isolated, owner),
                timeout=START_TIMEOUT,
                what="PostgreSQL to end the frozen owner's lock session",
            )

            mark = owner.mark()
            owner.resume()
            await owner.wait_for("lost the partition locks", timeout=START_TIMEOUT, after=mark)
            await owner.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT, after=owner.mark())

            async def ready_again() -> bool:
                return (await api.get("/readyz")).status_code == 200

            await until(ready_again, timeout=START_TIMEOUT, what="/readyz to be 200 again")
            assert _gauge(await _metrics(api), "stale", 0) == 0.0
    finally:
        procs.close()


async def _metrics(api: httpx.AsyncClient) -> str:
    answer = await api.get("/metrics", headers=METRICS_AUTH)
    assert answer.status_code == 200, answer.text
    return answer.text


def _gauge(text: str, name: str, partition: int) -> float:
    found = re.search(rf'^toolledger_partition_lease_{name}{{partition="{partition}"}} (\S+)$',
                      text, re.MULTILINE)  # fmt: skip
    assert found is not None, f"no lease {name} gauge for partition {partition}"
    return float(found.group(1))


def _host(message: str, owner: Proc) -> str:
    found = re.search(rf"\((\S+) pid {owner.pid}\)", message)
    assert found is not None, message
    return str(found.group(1))


async def _lock_session_gone(isolated: Isolated, owner: Proc) -> bool:
    db = LedgerDB(isolated.database_url, isolated.schema)
    try:
        rows = await db.fetch(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = $1",
            f"toolledger-locks-{owner.pid}",
        )
    finally:
        await db.close()
    return not rows


async def _lock_backend(s: Scene, proc: Proc) -> int:
    """The server pid of `proc`'s lock session."""
    rows = await s.db.fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
        f"toolledger-locks-{proc.pid}",
    )
    assert len(rows) == 1, rows
    return int(rows[0]["pid"])
