"""The drill driver: hands runs to runtime workers, kills them, and keeps going until every run
finished.

The runs of a drill are a shared work list. Every fraction of a second the driver reads the
ledger: a run the ledger has never heard of is to be started; a run `running` that no live
worker holds is to be resumed (its worker died); a paused run is to be resumed once
`resumable_runs()` yields it (its call was settled by the reconciler, a resuming runtime or the
operator). Up to `workers` worker processes drive runs at a time, each a batch of runs;
`spares` more are kept connected and idle (`--standby`), so a dead worker's runs go to a fresh
process at once instead of after the seconds a new process needs to import and connect.

Most workers are sent to die. While the kill budget lasts, each new worker gets a plan: either a
kill point and a count (it SIGKILLs itself the n-th time it reaches that point, after logging
it), or an external SIGKILL from the driver at a random moment after it connected. The count
is drawn so that the kills spread over the drill: about as many calls are made between two
kills as there is work left per kill left. Plans aim first at the kinds of kill not delivered
yet (`kinds_owed`): a plan that missed (its worker finished first, which load makes common) is
retried, past the budget if need be. Once the budget is spent and every kind was delivered,
workers run clean and the remaining runs finish. Now and then a run that a live worker drives
is handed to a second one as well (two runtimes driving one run): fencing must make one of them
stand down.

A run whose process died after `RunStarted` landed but before its prompt checkpoint did cannot
be resumed (`AgentRun.resume` says so): it is replaced by a new run and counted as such.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolledger.drill.killpoints import (
    EXTERNAL,
    KILL_KINDS,
    KILL_POINTS,
    KillPlan,
    append_line,
    kinds_owed,
    read_lines,
)
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.drill.model import TENANT
from toolledger.drill.procs import Proc, Procs
from toolledger.drill.verdicts import VERDICTS_FILE
from toolledger.drill.worker import entry as worker_entry
from toolledger.drill.worker import write_order
from toolledger.errors import LedgerUnavailable
from toolledger.projections.dberrors import DATABASE_ERRORS
from toolledger.runtime.ledger import Ledger

#: What a work-list refresh meets while PostgreSQL restarts: the drill's own queries fail with
#: database errors, the ledger's reads (`resumable_runs`) fail closed as `LedgerUnavailable`.
_REFRESH_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, LedgerUnavailable)

log = logging.getLogger("toolledger.drill")

#: progress(finished runs, runs, runtime kills)
Progress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class DispatchConfig:
    runs: int
    calls: int
    kills: int
    workers: int
    spares: int
    runs_per_worker: int
    external_share: float
    double_drive_rate: float
    dup_rate: float
    slow_rate: float
    deadline: float


@dataclass
class Worker:
    """A worker process: a spare until it is given runs and a kill plan."""

    name: str
    proc: Proc
    results: Path
    runs: list[str] = field(default_factory=list)
    plan: KillPlan = field(default_factory=KillPlan)
    external_after: float | None = None
    ready: bool = False
    assigned_at: float | None = None
    killed_externally: bool = False

    def is_ready(self) -> bool:
        if not self.ready:
            self.ready = any(line.get("ready") for line in read_lines(self.results))
        return self.ready


@dataclass
class DispatchTally:
    """What happened to the runs and the runtime workers."""

    workers_started: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    results: Counter[str] = field(default_factory=Counter)
    double_drives: int = 0
    replaced: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    worker_pids: set[int] = field(default_factory=set)
    finished: dict[str, str] = field(default_factory=dict)
    timed_out: bool = False


class Dispatcher:
    """The work list and the runtime workers (see the module docstring)."""

    def __init__(
        self,
        config: DispatchConfig,
        procs: Procs,
        db: LedgerDB,
        ledger: Ledger,
        home: Path,
        rng: random.Random,
        progress: Progress | None = None,
    ) -> None:
        self.config = config
        self.procs = procs
        self.db = db
        self.ledger = ledger
        self.home = home
        self.rng = rng
        self.progress = progress
        self.kill_log = home / "kills.jsonl"
        self.dup_log = home / "duplicates.jsonl"
        self.verdicts = home / VERDICTS_FILE
        self.tally = DispatchTally()
        self.pending: dict[str, None] = dict.fromkeys(f"r{n:05d}" for n in range(config.runs))
        self.live: list[Worker] = []
        self.spares: list[Worker] = []
        self.held: dict[str, set[str]] = {}
        self._states: dict[str, tuple[str, int | None]] = {}
        self._done: dict[str, int] = {}
        self._points: dict[str, str] = {}
        self._points_read = 0

    @property
    def runs(self) -> list[str]:
        """Every run of the drill that is still counted (replaced runs are not)."""
        return [r for r in (*self.tally.finished, *self.pending) if r not in self.tally.replaced]

    @property
    def kills_done(self) -> int:
        return sum(self.tally.kills.values())

    def live_procs(self) -> list[Proc]:
        return [w.proc for w in self.live]

    async def run(self) -> None:
        """Until every run finished (or the drill's deadline passed); then retire the spares."""
        refresh_at = 0.0
        runnable: list[str] = []
        try:
            while self.pending or self.live:
                now = time.monotonic()
                if now > self.config.deadline:
                    self.tally.timed_out = True
                    log.error(
                        "the drill ran out of time with %d runs unfinished", len(self.pending)
                    )
                    self._stop_live()
                    return
                self._reap()
                self._external_kills(now)
                if now >= refresh_at:
                    runnable = await self._runnable()
                    refresh_at = now + 0.25
                    self._timeline(runnable)
                runnable = self._launch(runnable, now)
                self._top_up_spares()
                if self.progress is not None:
                    self.progress(len(self.tally.finished), self.config.runs, self.kills_done)
                await asyncio.sleep(0.05)
        finally:
            self.retire_spares()

    def _stop_live(self) -> None:
        """At the time-out: stop the workers still driving runs, so that the ledger the checks
        read no longer moves (their calls in flight stay unsettled, and are judged so). Not
        counted as kills: the drill did not plan them."""
        for worker in self.live:
            worker.proc.kill()
        self.live.clear()

    def retire_spares(self) -> None:
        """Tell the idle spares there is nothing to do, and let them exit."""
        for spare in self.spares:
            write_order(spare.results, {"retire": True})
        for spare in self.spares:
            try:
                spare.proc.popen.wait(15)
            except subprocess.TimeoutExpired:
                spare.proc.kill()
        self.spares.clear()

    # -- the work list ---------------------------------------------------------------------------

    async def _runnable(self) -> list[str]:
        try:
            states = await self.db.run_states(TENANT)
            done = await self.db.completed_calls(TENANT)
            resumable = {r.run_id async for r in self.ledger.resumable_runs(follow=False)}
        except _REFRESH_ERRORS as exc:  # PostgreSQL restarting: the next refresh tries again
            log.warning("work list not refreshed (%s)", exc)
            return []
        self._states, self._done = states, done
        out = []
        for run in list(self.pending):
            if self.held.get(run):
                continue
            state = self._states.get(run)
            if state is None or state[0] == "running" or run in resumable:
                out.append(run)
            elif state[0] in ("completed", "failed", "cancelled"):
                del self.pending[run]
                self.tally.finished[run] = state[0]
        self.rng.shuffle(out)
        return out

    def _timeline(self, runnable: list[str]) -> None:
        """One line per refresh in `timeline.jsonl`: how the drill is going, for post-mortems."""
        statuses = Counter(self._states.get(r, ("new", None))[0] for r in self.pending)
        append_line(
            self.home / "timeline.jsonl",
            {
                "t": time.time(),
                "finished": len(self.tally.finished),
                "runnable": len(runnable),
                "live": len(self.live),
                "spares": len(self.spares),
                "kills": self.kills_done,
                **statuses,
            },
        )

    def _launch(self, runnable: list[str], now: float) -> list[str]:
        spread = math.ceil(len(self.pending) / self.config.workers)
        batch_size = max(1, min(self.config.runs_per_worker, spread))
        while runnable and len(self.live) < self.config.workers:
            spare = next((s for s in self.spares if s.is_ready()), None)
            if spare is None:
                break
            batch, runnable = runnable[:batch_size], runnable[batch_size:]
            batch = [r for r in batch if r in self.pending and not self.held.get(r)]
            if not batch:
                continue
            if self.rng.random() < self.config.double_drive_rate:
                driven = [
                    r
                    for r, holders in self.held.items()
                    if holders and self._states.get(r, ("", None))[0] == "running"
                ]
                if driven:
                    batch.append(self.rng.choice(sorted(driven)))
                    self.tally.double_drives += 1
            self.assign(spare, batch, now)
        return runnable

    def assign(self, spare: Worker, runs: list[str], now: float) -> None:
        """Give a ready spare its runs and its kill plan."""
        spare.plan, spare.external_after = self._plan()
        order = {"runs": ",".join(runs), "plan": spare.plan.encode()}
        write_order(spare.results, {**order, "seed": self.rng.randrange(2**31)})
        spare.runs = runs
        spare.assigned_at = now
        if spare in self.spares:
            self.spares.remove(spare)
        self.live.append(spare)
        for run in runs:
            self.held.setdefault(run, set()).add(spare.name)

    @property
    def kill_kinds(self) -> tuple[str, ...]:
        """The kinds of kill this drill delivers (no external ones with `external_share` 0)."""
        return KILL_KINDS if self.config.external_share > 0 else KILL_POINTS

    def _owed(self) -> list[str]:
        planned: list[str | None] = [w.plan.point for w in self.live]
        planned += [EXTERNAL for w in self.live if w.external_after is not None]
        return kinds_owed(self.kill_kinds, self.tally.kills, planned)

    def _aim(self, kind: str, nth: int) -> tuple[KillPlan, float | None]:
        for point in KILL_POINTS:
            if point == kind:
                return KillPlan(point, nth), None
        return KillPlan(), self.rng.uniform(0.02, 1.5)

    def _plan(self) -> tuple[KillPlan, float | None]:
        if self.config.kills <= 0:
            return KillPlan(), None
        owed = self._owed()
        if self.kills_done >= self.config.kills:
            # The budget is spent but a kind was missed: retry it at its first chance.
            return self._aim(owed[0], 1) if owed else (KillPlan(), None)
        # Spread the kills over the first three quarters of the work (in the last quarter few
        # runs are left, and a run whose call must wait for its deadline to pass waits alone):
        # about as many calls between two kills as calls left for kills per kill left.
        work_left = sum(self.config.calls + 1 - self._done.get(r, 0) for r in self.pending)
        spread = work_left - 0.25 * (self.config.calls + 1) * self.config.runs
        if spread <= 0:
            # The last quarter while kills are owed: every worker dies at its first model call.
            # No run can finish without one, so the budget is spent before the last run
            # finishes. Plans of live workers are not counted here (one that never fires, an
            # external kill that comes after its worker finished, must not leave the budget
            # unspent), so the last kills may overshoot it by a few.
            return self._aim(owed[0] if owed else "model", 1)
        planned = sum(1 for w in self.live if w.plan.point or w.external_after is not None)
        left = self.config.kills - self.kills_done - planned
        if left <= 0:
            return KillPlan(), None
        if owed:
            kind = self.rng.choice(owed)
        elif self.rng.random() < self.config.external_share:
            kind = EXTERNAL
        else:
            kind = self.rng.choice(KILL_POINTS)
        mean = spread / left
        if mean <= 1:
            return self._aim(kind, 1)
        return self._aim(kind, self.rng.randint(1, max(1, math.floor(2 * mean) - 1)))

    def _top_up_spares(self) -> None:
        while len(self.spares) + len(self.live) < self.config.workers + self.config.spares:
            self.spares.append(self.start_spare())

    def start_spare(self) -> Worker:
        """A new worker process that connects and then waits for its order on stdin."""
        self.tally.workers_started += 1
        name = f"worker-{self.tally.workers_started}"
        results = self.home / "results" / f"{name}.jsonl"
        argv = [
            "--standby",
            "--worker",
            name,
            "--calls",
            str(self.config.calls),
            "--kill-log",
            str(self.kill_log),
            "--results",
            str(results),
            "--verdicts",
            str(self.verdicts),
            "--dup-log",
            str(self.dup_log),
            "--dup-rate",
            str(self.config.dup_rate),
            "--slow-rate",
            str(self.config.slow_rate),
        ]
        proc = self.procs.fork(name, worker_entry, argv)
        self.tally.worker_pids.add(proc.pid)
        return Worker(name, proc, results)

    def _external_kills(self, now: float) -> None:
        for worker in self.live:
            if worker.external_after is None or worker.killed_externally:
                continue
            assert worker.assigned_at is not None
            if now >= worker.assigned_at + worker.external_after and worker.proc.alive():
                worker.killed_externally = True
                worker.proc.signal(signal.SIGKILL)

    def _reap(self) -> None:
        for spare in [s for s in self.spares if not s.proc.alive()]:
            self.spares.remove(spare)
            tail = spare.proc.output()[-3000:]
            self.tally.errors.append(
                f"spare {spare.name} exited with {spare.proc.returncode}:\n{tail}"
            )
        for worker in [w for w in self.live if not w.proc.alive()]:
            self.live.remove(worker)
            self._ended(worker)
        self.procs.reap()

    def _ended(self, worker: Worker) -> None:
        code = worker.proc.returncode
        for run in worker.runs:
            self.held.get(run, set()).discard(worker.name)
        if code == -signal.SIGKILL:
            if worker.killed_externally:
                line = {"point": EXTERNAL, "worker": worker.name, "pid": worker.proc.pid}
                append_line(self.kill_log, {**line, "t": time.time()})
                self.tally.kills[EXTERNAL] += 1
            else:
                self.tally.kills[self._logged_point(worker)] += 1
        elif code != 0:
            tail = worker.proc.output()[-3000:]
            self.tally.errors.append(f"{worker.name} exited with {code}:\n{tail}")
        for line in read_lines(worker.results):
            run_id = line.get("run")
            if not isinstance(run_id, str):
                continue
            status = str(line.get("status"))
            self.tally.results[status] += 1
            if status == "error":
                self.tally.errors.append(f"{worker.name}, run {run_id}: {line.get('detail')}")
            elif status == "orphaned" and run_id in self.pending:
                self._replace(run_id)

    def _logged_point(self, worker: Worker) -> str:
        """The kill point `worker` logged before it SIGKILLed itself."""
        if worker.name not in self._points:
            for line in read_lines(self.kill_log)[self._points_read :]:
                self._points[str(line.get("worker"))] = str(line.get("point"))
                self._points_read += 1
        return self._points.get(worker.name, "unattributed")

    def _replace(self, run: str) -> None:
        """A run that died before its prompt was saved can never resume: start a new one."""
        successor = f"{run}b"
        del self.pending[run]
        self.tally.replaced[run] = successor
        self.pending[successor] = None
