"""What a drill does to the ledger's own processes while the runs go on.

Each kind of trouble is a loop that strikes at random (seeded) intervals until the drill says
stop. Projector troubles take turns (one at a time), so there is always a projector able to
take over, which is the deployment the drill checks (two projector processes):

- **projector kill**: SIGKILL one of the two projectors, inside a batch or between batches (a
  seeded coin picks which), and start a fresh one. The victim is frozen while the drill asks
  PostgreSQL what it is doing (`LedgerDB.in_batch`: a small batch is one statement, too short
  to catch a running projector in), so the kill lands in the state seen. The survivor takes
  the partitions over within a second.
- **zombie projector**: SIGSTOP one that owns partitions, end all its server sessions (what
  PostgreSQL does to a client that stopped answering), wait until the other owns everything,
  then SIGCONT it: it must stand down and write nothing.
- **reconciler kill**: SIGKILL the reconciler once it works (owns facts partitions) and start
  another, which recovers its table from the changelog.
- **LISTEN kill**: end a runtime worker's LISTEN session; its waiters must still get verdicts.
- **poison**: append bytes no reader can decode, under their own run ids: they must land in
  the dead letters and quarantine those runs, and nothing else.
- **PostgreSQL restart** (private server only): `pg_ctl restart` mid-drill.
- **broker kill** (private Apache Kafka only): SIGKILL the broker mid-drill and start it again
  on its port and its data folder; the time until it acknowledges a produce again is recorded.

A projector trouble whose projectors are still starting waits for them instead of skipping its
turn, and a trouble that fails is a drill error (`Chaos.errors`), so the counts in the summary
are troubles that happened.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from toolledger.drill.ledgerdb import LedgerDB
from toolledger.drill.procs import Proc, Procs
from toolledger.drill.services import PrivatePostgres
from toolledger.errors import ExitStatus
from toolledger.events.log import EventLog

log = logging.getLogger("toolledger.drill")

#: Looks (freeze, ask PostgreSQL, thaw) for a projector in the state a kill aims at.
CATCH_TRIES = 300
#: What a reconciler logs once it has joined its group and owns facts partitions.
RECONCILER_UP = "owns facts partitions ["
#: What a resumed zombie projector logs when it finds it lost its partitions.
STOOD_DOWN = re.compile(r"lost the partition locks|another projector took this partition over")


@dataclass
class ChaosTally:
    projector_kills: Counter[str] = field(default_factory=Counter)
    zombies: int = 0
    zombies_stood_down: int = 0
    reconciler_kills: int = 0
    listen_kills: int = 0
    poison: list[str] = field(default_factory=list)
    postgres_restarts: int = 0
    #: Seconds from each broker SIGKILL until the restarted broker acknowledged a produce.
    broker_recoveries: list[float] = field(default_factory=list)
    #: Projectors that stopped with the log-identity error (exit 4) while the log was intact.
    identity_stops: list[str] = field(default_factory=list)


class Chaos:
    """The drill's projectors and reconciler, and the loops that trouble them."""

    def __init__(
        self,
        procs: Procs,
        db: LedgerDB,
        events: EventLog,
        rng: random.Random,
        *,
        reconciler_args: list[str],
        postgres: PrivatePostgres | None,
    ) -> None:
        self.procs = procs
        self.db = db
        self.events = events
        self.rng = rng
        self.reconciler_args = reconciler_args
        self.postgres = postgres
        self.tally = ChaosTally()
        self.projectors: list[Proc] = []
        self.reconciler: Proc | None = None
        self.reconciler_pids: set[int] = set()
        self.stopping = asyncio.Event()
        self._projector_turn = asyncio.Lock()
        self.errors: list[str] = []
        self._started = 0

    # -- processes -----------------------------------------------------------------------------

    def start_projector(self) -> Proc:
        self._started += 1
        proc = self.procs.python(
            f"projector-{self._started}", "toolledger", "projector", "--status-every", "1"
        )
        self.projectors.append(proc)
        return proc

    def start_reconciler(self) -> Proc:
        self._started += 1
        proc = self.procs.python(
            f"reconciler-{self._started}", "toolledger", "reconciler", *self.reconciler_args
        )
        self.reconciler = proc
        self.reconciler_pids.add(proc.pid)
        return proc

    def keep_projectors(self, count: int = 2) -> None:
        """Replace projectors that exited on their own (a crash is logged, not hidden)."""
        for proc in [p for p in self.projectors if not p.alive()]:
            log.warning("%s exited with %s; starting another", proc.name, proc.returncode)
            self.projectors.remove(proc)
            if proc.returncode == ExitStatus.LOG_MISMATCH:
                stopped = [line for line in proc.output().splitlines() if "stopped:" in line]
                self.tally.identity_stops.append(
                    f"{proc.name}: {stopped[-1] if stopped else 'exit 4'}"
                )
        while len(self.projectors) < count:
            self.start_projector()

    # -- loops ---------------------------------------------------------------------------------

    async def pause(self, seconds: float) -> bool:
        """Sleep `seconds`; False once the drill is stopping."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def every(self, mean: float, action: Callable[[], Awaitable[None]]) -> None:
        """Run `action` every `mean` seconds on average (0: never): half of it fixed, half
        exponentially distributed, so strikes are random but never pile up.

        An action that fails is a drill error, not a warning: a trouble the drill meant to
        cause and could not is a drill that did not test what its table says it did.
        """
        if mean <= 0:
            return
        while await self.pause(mean / 2 + self.rng.expovariate(2 / mean)):
            name = getattr(action, "__name__", "?")
            try:
                await action()
            except Exception as exc:
                log.exception("chaos action %s failed", name)
                self.errors.append(f"chaos action {name}: {exc!r}")

    async def tend(self) -> None:
        """Replace projectors that exited on their own, and a reconciler that did."""
        async with self._projector_turn:
            self.keep_projectors()
        if self.reconciler is not None and not self.reconciler.alive():
            log.warning(
                "the reconciler exited with %s; starting another", self.reconciler.returncode
            )
            self.start_reconciler()

    def _up(self, proc: Proc) -> bool:
        """Whether a projector finished starting (it logged what it owns at least once)."""
        return proc.alive() and "owns [" in proc.output()

    async def _projectors_ready(self) -> dict[int, int] | None:
        """Wait until both projectors are up and the partition locks are held by them; the
        owners (partition -> pid), or None if the drill is stopping.

        A trouble waits for the projectors a previous one left starting rather than skipping
        its turn: skipped turns are how a short drill used to report no zombies at all. There
        is no deadline: a start takes a second on a quiet machine and a minute under heavy
        load, and a projector that never comes up fails the drill's quiesce anyway.
        """
        while not self.stopping.is_set():
            self.keep_projectors()
            owners = await self.db.lock_owners()
            pids = {p.pid for p in self.projectors}
            if (
                all(self._up(p) for p in self.projectors)
                and owners
                and set(owners.values()) <= pids
            ):
                return owners
            await asyncio.sleep(0.1)
        return None

    async def kill_projector(self) -> None:
        """SIGKILL a projector inside a batch or between batches (the seeded coin decides), and
        start another. The victim is frozen while the drill looks at what it is doing, so the
        kill lands in the state that was seen (`LedgerDB.in_batch`)."""
        async with self._projector_turn:
            owners = await self._projectors_ready()
            if owners is None:
                return
            inside = self.rng.random() < 0.5
            candidates = [p for p in self.projectors if p.pid in owners.values()]
            victim = self.rng.choice(candidates if inside else self.projectors)
            caught = False
            for _ in range(CATCH_TRIES):
                if self.stopping.is_set():
                    inside = False
                victim.freeze()
                try:
                    caught = not victim.alive() or await self.db.in_batch(victim.pid) == inside
                finally:
                    if not caught:
                        victim.thaw()
                if caught:
                    break  # killed below while still frozen, in the state just seen
                await asyncio.sleep(self.rng.uniform(0.0, 0.01))
            else:
                # Nothing to project for a while (the runs are between steps): the kill still
                # happens, between batches, and is counted as such.
                log.info("%s not caught inside a batch; killing it between batches", victim.name)
                inside = False
            victim.kill()
            self.tally.projector_kills["inside a batch" if inside else "between batches"] += 1
            self.projectors.remove(victim)
            self.start_projector()

    async def zombie_projector(self) -> None:
        async with self._projector_turn:
            owners = await self._projectors_ready()
            if owners is None:
                return
            candidates = [p for p in self.projectors if p.pid in owners.values()]
            victim = self.rng.choice(candidates)
            survivor = next(p for p in self.projectors if p is not victim)
            mark = len(victim.output())
            victim.freeze()
            try:
                await self.db.terminate(
                    [f"toolledger-{kind}-{victim.pid}" for kind in ("store", "locks", "listen")]
                )
                for _ in range(100):
                    owners = await self.db.lock_owners()
                    if owners and set(owners.values()) == {survivor.pid}:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(self.rng.uniform(0.2, 1.5))
            finally:
                victim.thaw()
            self.tally.zombies += 1
            for _ in range(150):
                if not victim.alive() or STOOD_DOWN.search(victim.output(), mark):
                    self.tally.zombies_stood_down += 1
                    break
                await asyncio.sleep(0.1)

    async def kill_reconciler(self) -> None:
        """SIGKILL the reconciler once it is working (it owns facts partitions), and start
        another. Killing one still starting would count a kill of nothing and, under load, keep
        any reconciler from ever settling a call."""
        while not self.stopping.is_set():
            victim = self.reconciler
            if victim is None or not victim.alive():
                return  # `tend` starts another
            if RECONCILER_UP in victim.output():
                victim.kill()
                self.tally.reconciler_kills += 1
                self.start_reconciler()
                return
            await asyncio.sleep(0.1)

    async def kill_listen(self, workers: Callable[[], list[Proc]]) -> None:
        live = [w for w in workers() if w.alive()]
        if live:
            victim = self.rng.choice(live)
            self.tally.listen_kills += await self.db.terminate([f"toolledger-listen-{victim.pid}"])

    async def poison(self, count: int, within: float) -> None:
        """Append `count` undecodable records at random moments of the first `within` s."""
        moments = sorted(self.rng.uniform(0.5, within) for _ in range(count))
        waited = 0.0
        for i, at in enumerate(moments):
            if not await self.pause(at - waited):
                return
            waited = at
            run_id = f"poison-{i}"
            await self.events.append(run_id, b"\x00drill poison " + os.urandom(16))
            self.tally.poison.append(run_id)

    async def restart_postgres(self, count: int, within: float) -> None:
        """`pg_ctl restart` the private server `count` times in the first `within` s.

        Every restart happens even if the runs finish first (the drill waits for this loop
        before it quiesces), so the count in the report is the count asked for.
        """
        if self.postgres is None or count <= 0:
            return
        moments = sorted(self.rng.uniform(2.0, within) for _ in range(count))
        waited = 0.0
        for at in moments:
            await asyncio.sleep(at - waited)
            waited = at
            await asyncio.to_thread(self.postgres.restart)
            self.tally.postgres_restarts += 1

    async def kill_broker(self, count: int, within: float, kill: Callable[[], float]) -> None:
        """SIGKILL the private broker and restart it on its data (`kill`) `count` times in the
        first `within` s, each kill once the previous restart was acknowledging produces.
        Like the PostgreSQL restarts, every kill happens even if the runs finish first."""
        if count <= 0:
            return
        moments = sorted(self.rng.uniform(3.0, within) for _ in range(count))
        started = asyncio.get_running_loop().time()
        for at in moments:
            await asyncio.sleep(max(0.0, at - (asyncio.get_running_loop().time() - started)))
            self.tally.broker_recoveries.append(await asyncio.to_thread(kill))
