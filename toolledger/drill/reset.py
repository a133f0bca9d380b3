"""The broker reset that ends a drill run with `--broker-reset`.

The local broker (tansu) keeps nothing across a restart, so restarting the drill's private
broker on its port is what losing a Kafka cluster's data looks like. What must follow
(docs/architecture.md, "The projector": the log's identity; "Fail closed"):

- the running projectors stop with the log-identity error (exit status 4), and so does one
  started after the reset: the epoch marker they stored is gone from offset 0;
- a runtime that starts a run afterwards fails closed: no verdict comes, the run ends
  `unavailable`, and no request reaches billing;
- nothing in PostgreSQL changes: the ledger's digest is the same before and after.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, replace

from toolledger.drill.billing import DrillBilling
from toolledger.drill.chaos import Chaos
from toolledger.drill.checks import Check
from toolledger.drill.driver import Dispatcher
from toolledger.drill.killpoints import read_lines
from toolledger.drill.services import DrillServices
from toolledger.errors import ExitStatus
from toolledger.wiring.stack import LedgerStack


async def broker_reset(
    services: DrillServices,
    stack: LedgerStack,
    chaos: Chaos,
    dispatcher: Dispatcher,
    billing: DrillBilling,
    partitions: int,
) -> list[Check]:
    """Reset the drill's private broker; the checks of what must follow (module docstring)."""
    before = await stack.store.digest()
    projectors = [chaos.start_projector(), chaos.start_projector()]
    # Both running, not only the partitions owned: a projector still connecting when the broker
    # goes away fails its start (status 4), which says nothing about how running ones react.
    for _ in range(600):
        owners = await dispatcher.db.lock_owners()
        running = all("owns [" in p.output() for p in projectors)
        if len(owners) == partitions and running:
            break
        await asyncio.sleep(0.1)
    await asyncio.to_thread(services.reset_broker)
    identity = re.compile(r"stopped: .*(epoch marker|does not exist|gone|lost its data)")
    for _ in range(600):
        if not any(p.alive() for p in projectors):
            break
        await asyncio.sleep(0.1)
    stopped = [
        p.returncode == ExitStatus.LOG_MISMATCH and bool(identity.search(p.output()))
        for p in projectors
    ]
    probe = "probe-after-reset"
    requests_before = sum(sum(c.values()) for c in billing.requests().values())
    dispatcher.procs.env["TOOLLEDGER_VERDICT_TIMEOUT_S"] = "3"
    dispatcher.config = replace(dispatcher.config, kills=0, double_drive_rate=0.0)
    worker = dispatcher.start_spare()
    for _ in range(900):
        if worker.is_ready() or not worker.proc.alive():
            break
        await asyncio.sleep(0.1)
    if worker.proc.alive():
        dispatcher.assign(worker, [probe], time.monotonic())
    for _ in range(900):
        if not worker.proc.alive():
            break
        await asyncio.sleep(0.1)
    results = [line for line in read_lines(worker.results) if line.get("run") == probe]
    late = chaos.start_projector()
    for _ in range(600):
        if not late.alive():
            break
        await asyncio.sleep(0.1)
    return judge_reset(
        ResetEvidence(
            stopped=stopped,
            projector_codes=[p.returncode for p in projectors],
            late_code=late.returncode,
            probe=results[0] if results else None,
            requests_before=requests_before,
            requests_after=sum(sum(c.values()) for c in billing.requests().values()),
            digest_before=before,
            digest_after=await stack.store.digest(),
        )
    )


@dataclass(frozen=True)
class ResetEvidence:
    """What the reset left behind, for `judge_reset`."""

    #: Per running projector: it exited 3 with the log-identity error in its output.
    stopped: list[bool]
    projector_codes: list[int | None]
    #: The exit status of a projector started after the reset (None: still running).
    late_code: int | None
    #: The probe run's result line, if its worker wrote one.
    probe: dict[str, object] | None
    requests_before: int
    requests_after: int
    digest_before: str
    digest_after: str


def judge_reset(ev: ResetEvidence) -> list[Check]:
    """The reset's three checks (module docstring), from what it left behind."""
    failed_closed = (
        ev.probe is not None
        and ev.probe.get("status") == "unavailable"
        and ev.requests_after == ev.requests_before
    )
    ended = (
        f"{ev.probe.get('status')} ({str(ev.probe.get('detail'))[:90]})"
        if ev.probe is not None
        else "without a result"
    )
    return [
        Check(
            "broker reset stops the projectors",
            bool(ev.stopped) and all(ev.stopped) and ev.late_code == ExitStatus.LOG_MISMATCH,
            f"running projectors exited with {ev.projector_codes}, one started after the reset "
            f"with {ev.late_code} (4: the log-identity error)",
        ),
        Check(
            "runtimes fail closed after a broker reset",
            failed_closed,
            f"a run started after the reset ended {ended}; "
            f"{ev.requests_after - ev.requests_before} requests reached billing after it",
        ),
        Check(
            "nothing in PostgreSQL lost in a broker reset",
            ev.digest_after == ev.digest_before,
            f"ledger digest {ev.digest_before[:16]} before, {ev.digest_after[:16]} after",
        ),
    ]
