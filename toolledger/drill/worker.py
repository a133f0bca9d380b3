"""A drill's runtime worker: drives the runs it was given with `AgentRun` until they end or pause.

`python -m toolledger.drill.worker --worker w7 --runs r0001,r0002 --calls 5 --plan reserved:3`

With `--standby` it connects first and then waits for its order file: the driver keeps a
few such spares warm, so a killed worker's runs are taken over without waiting for a new
process to import and connect (on a busy two-core machine that takes seconds).

Each run is started if the ledger has never heard of it, else resumed from its latest
checkpoint (after a crash, or after its pause ended), all concurrently on one `Ledger`. One
JSON line per run goes to `--results` (`completed`, `awaiting_reconciliation`, `superseded`,
`unavailable`, `orphaned`, `error`), after a `ready` line once connected. The drill driver
hands out the runs, reads the results, and SIGKILLs workers from outside as well.

The kill points (`toolledger.drill.killpoints`) are wired in here: the model's and the tools'
by module-level hooks, and the ones around the ledger by `DrillCommands`, which wraps the
stack's command path (`reserved` after an accepted reservation verdict, `before_outcome` and
`after_outcome` around the runtime's outcome append). `DrillCommands` also plays a producer
that retries: now and then it appends an event's bytes a second time, right away or after
later events, and the projector must apply that event once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import time
import traceback
from pathlib import Path
from typing import Any

from toolledger import Ledger, LedgerUnavailable, RunSuperseded
from toolledger.drill import tools
from toolledger.drill.killpoints import KillPlan, KillPoints, append_line
from toolledger.drill.model import AGENT, TENANT, ScriptedModel, prompt
from toolledger.events.codec import encode
from toolledger.events.log import LogError, Position
from toolledger.events.models import (
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallReserved,
    Event,
)
from toolledger.events.records import Verdict
from toolledger.projections.dberrors import DATABASE_ERRORS
from toolledger.runtime.runs import AgentRun
from toolledger.wiring.commands import LedgerCommands


class DrillCommands(LedgerCommands):
    """The stack's commands with the ledger-side kill points and duplicate deliveries."""

    def __init__(
        self,
        base: LedgerCommands,
        kill_points: KillPoints,
        *,
        dup_rate: float,
        dup_log: Path | None,
        rng: random.Random,
    ) -> None:
        super().__init__(base.events, base.waiter)
        self.kill_points = kill_points
        self.dup_rate = dup_rate
        self.dup_log = dup_log
        self.rng = rng
        self._later: list[Event] = []

    async def append(self, event: Event, timeout: float) -> Position:
        outcome = _runtime_outcome(event)
        if outcome:
            self.kill_points.reach("before_outcome", event.key)
        position = await super().append(event, timeout)
        await self._duplicate(event)
        if outcome:
            self.kill_points.reach("after_outcome", event.key)
        return position

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        verdict = await super().append_and_await(event, timeout)
        if isinstance(event, CallReserved) and verdict.accepted:
            self.kill_points.reach("reserved", event.key)
        return verdict

    async def _duplicate(self, event: Event) -> None:
        """Now and then, append an event's bytes again: this one now, or an earlier one late."""
        if self.dup_rate <= 0:
            return
        roll = self.rng.random()
        if roll < self.dup_rate:
            again: Event | None = event
        elif roll < 2 * self.dup_rate:
            self._later.append(event)
            again = None
        else:
            again = self._later.pop(0) if self._later and roll > 1 - self.dup_rate else None
        if again is None:
            return
        if self.dup_log is not None:
            append_line(self.dup_log, {"event_id": str(again.event_id), "type": again.type})
        with contextlib.suppress(LogError):  # a retry that fails is one that did not happen
            await self.events.append(again.run_id, encode(again))


def _runtime_outcome(event: Event) -> bool:
    if isinstance(event, CallCompleted | CallFailed):
        return event.source == "runtime"
    return isinstance(event, CallIndeterminate)


async def _drive(
    ledger: Ledger, run_id: str, calls: int, kill_points: KillPoints
) -> dict[str, Any]:
    run = AgentRun(
        ledger,
        run_id=run_id,
        tenant_id=TENANT,
        agent=AGENT,
        tools=tools.drill,
        model=ScriptedModel(run_id, calls, kill_points),
    )
    try:
        record = await ledger.stack.store.get_run(run_id)
        if record is None:
            result = await run.start(prompt(run_id, calls))
        elif record.version in (None, 0) and record.status == "running":
            return {"status": "orphaned", "detail": "started, but its prompt was never saved"}
        else:
            result = await run.resume()
        return {"status": result.status, "waiting_on": result.waiting_on}
    except RunSuperseded as exc:
        return {"status": "superseded", "detail": str(exc)}
    except LedgerUnavailable as exc:
        return {"status": "unavailable", "detail": f"{type(exc).__name__}: {exc}"}
    except DATABASE_ERRORS as exc:
        return {"status": "unavailable", "detail": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:
        return {"status": "error", "detail": "".join(traceback.format_exception(exc))}


async def _connect(attempts: int = 60) -> Ledger:
    """`Ledger.connect()`, retried as a supervisor would restart a runtime that could not
    start: a worker forked while PostgreSQL restarts must wait for it, not count as a crash."""
    retriable: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, LogError, LedgerUnavailable)
    for attempt in range(1, attempts + 1):
        try:
            return await Ledger.connect()
        except retriable:
            if attempt == attempts:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def main(args: argparse.Namespace) -> None:
    kill_points = KillPoints(KillPlan(), Path(args.kill_log), args.worker)
    tools.kill_points = kill_points
    results = Path(args.results)

    def emit(line: dict[str, Any]) -> None:
        append_line(results, {"worker": args.worker, "pid": os.getpid(), "t": time.time(), **line})

    ledger = await _connect()
    try:
        emit({"ready": True})
        order = {"runs": args.runs, "plan": args.plan, "seed": args.seed}
        if args.standby:
            order = await _await_order(Path(args.results).with_suffix(".order"))
            if order.get("retire"):
                return
        kill_points.plan = KillPlan.parse(order["plan"])
        # Forked workers inherit one random state: give each its own sequence.
        random.seed(order["seed"])
        tools.slow_responses = args.slow_rate
        ledger.stack.commands = DrillCommands(
            ledger.stack.commands,
            kill_points,
            dup_rate=args.dup_rate,
            dup_log=Path(args.dup_log) if args.dup_log else None,
            rng=random.Random(order["seed"]),
        )
        runs = [r for r in str(order["runs"]).split(",") if r]
        emit({"assigned": runs, "plan": kill_points.plan.encode()})

        async def one(run_id: str) -> None:
            emit({"run": run_id, **await _drive(ledger, run_id, args.calls, kill_points)})

        await asyncio.gather(*(one(r) for r in runs))
    finally:
        await ledger.close()
        emit({"closed": True})


async def _await_order(path: Path) -> dict[str, Any]:
    """The order the driver writes (atomically, by rename) once it has runs for this spare."""
    return await asyncio.to_thread(_read_order, path)


def _read_order(path: Path) -> dict[str, Any]:
    while not path.exists():
        time.sleep(0.01)
    order: dict[str, Any] = json.loads(path.read_text())
    return order


def write_order(results: Path, order: dict[str, Any]) -> None:
    """Give a standby worker its order (see `_await_order`)."""
    tmp = results.with_suffix(".order.tmp")
    tmp.write_text(json.dumps(order))
    os.replace(tmp, results.with_suffix(".order"))


def entry(argv: list[str]) -> None:
    """The worker's main for a process forked by the drill (`Procs.fork`)."""
    _log_warnings()
    asyncio.run(main(_parser().parse_args(argv)))


def _log_warnings() -> None:
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m toolledger.drill.worker")
    parser.add_argument("--worker", required=True, help="this worker's name in the drill")
    parser.add_argument("--runs", default="", help="comma-separated run ids to drive")
    parser.add_argument(
        "--standby",
        action="store_true",
        help="connect, then wait for the order (JSON: runs, plan, seed) in <results>.order",
    )
    parser.add_argument("--calls", type=int, required=True, help="tool calls per run")
    parser.add_argument("--plan", default="none", help="none, or POINT:N (die there)")
    parser.add_argument("--kill-log", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--dup-log", default="")
    parser.add_argument("--dup-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--slow-rate", type=float, default=0.0, help="share of billing responses that time out"
    )
    return parser


if __name__ == "__main__":
    _log_warnings()
    asyncio.run(main(_parser().parse_args()))
