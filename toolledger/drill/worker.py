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
by module-level hooks, and the ones around the ledger by the worker's port (`DrillPort`,
`toolledger.drill.port`), which also plays a producer that retries and writes down every
verdict the runtime hears, with the path that answered it (`--verdicts`). The port is the one
`Ledger.connect()` would give (the leader fast path with `TOOLLEDGER_LEADER=auto`), wrapped.
"""

from __future__ import annotations

import argparse
import asyncio
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
from toolledger.drill.acked import ACKED_FILE, AckRecord
from toolledger.drill.barrier import barrier
from toolledger.drill.killpoints import KillPlan, KillPoints, append_line
from toolledger.drill.model import AGENT, TENANT, ScriptedModel, prompt
from toolledger.drill.port import DirectPath, DrillPort, Duplicates
from toolledger.drill.verdicts import VerdictRecord
from toolledger.events.log import LogError
from toolledger.projections.dberrors import DATABASE_ERRORS
from toolledger.runtime.runs import AgentRun
from toolledger.settings import Settings, load_settings
from toolledger.wiring.leader import leader_port
from toolledger.wiring.stack import LedgerStack

#: Seconds a worker waits for a barrier's verdict (a projector taking over a partition).
BARRIER_TIMEOUT = 60.0


async def _drive(
    ledger: Ledger, run_id: str, calls: int, kill_points: KillPoints, partitions: int
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
        if record is not None and record.status == "running":
            # A run taken over from a dead worker is judged (orphaned?) and resumed from what
            # PostgreSQL holds, and that worker may have heard verdicts from a leader that
            # are not committed yet: read it again after a barrier, or the resume would start
            # from an older checkpoint and be fenced off as a stale driver. (A paused run is
            # resumed once PostgreSQL shows its call settled, so its pause is committed.)
            await barrier(ledger.stack.commands, run_id, partitions, timeout=BARRIER_TIMEOUT)
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


async def _connect(
    settings: Settings, kill_points: KillPoints, verdicts: VerdictRecord, attempts: int = 60
) -> tuple[Ledger, DrillPort]:
    """The ledger a runtime gets from its settings (`Ledger.connect()`: the leader fast path
    with `TOOLLEDGER_LEADER=auto`), on the drill's port. Retried as a supervisor would restart
    a runtime that could not start: a worker forked while PostgreSQL restarts must wait for it,
    not count as a crash."""
    retriable: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, LogError, LedgerUnavailable)
    for attempt in range(1, attempts + 1):
        try:
            stack = await LedgerStack.connect(settings)
        except retriable:
            if attempt == attempts:
                raise
            await asyncio.sleep(0.5)
            continue
        acked = AckRecord(verdicts.path and verdicts.path.parent / ACKED_FILE, verdicts.worker)
        port = DrillPort(leader_port(DirectPath(stack), settings), kill_points, verdicts, acked)
        ledger = Ledger(port, verdict_timeout=settings.verdict_timeout_s, on_close=stack.close)
        return ledger, port
    raise AssertionError("unreachable")


async def main(args: argparse.Namespace) -> None:
    kill_points = KillPoints(KillPlan(), Path(args.kill_log), args.worker)
    tools.kill_points = kill_points
    results = Path(args.results)

    def emit(line: dict[str, Any]) -> None:
        append_line(results, {"worker": args.worker, "pid": os.getpid(), "t": time.time(), **line})

    settings = load_settings()
    verdicts = VerdictRecord(Path(args.verdicts), args.worker)
    ledger, port = await _connect(settings, kill_points, verdicts)
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
        port.duplicates = Duplicates(
            args.dup_rate,
            Path(args.dup_log) if args.dup_log else None,
            random.Random(order["seed"]),
        )
        runs = [r for r in str(order["runs"]).split(",") if r]
        emit({"assigned": runs, "plan": kill_points.plan.encode()})

        async def one(run_id: str) -> None:
            ended = await _drive(ledger, run_id, args.calls, kill_points, settings.partitions)
            emit({"run": run_id, **ended})

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
    parser.add_argument("--verdicts", required=True, help="where to append the verdicts heard")
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
