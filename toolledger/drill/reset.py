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
from dataclasses import replace

from toolledger.drill.billing import DrillBilling
from toolledger.drill.chaos import Chaos
from toolledger.drill.checks import Check
from toolledger.drill.driver import Dispatcher
from toolledger.drill.killpoints import read_lines
from toolledger.drill.services import DrillServices
from toolledger.errors import ExitStatus
from toolledger.stack import LedgerStack


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
    failed_closed = (
        bool(results)
        and results[0].get("status") == "unavailable"
        and sum(sum(c.values()) for c in billing.requests().values()) == requests_before
    )
    late = chaos.start_projector()
    for _ in range(600):
        if not late.alive():
            break
        await asyncio.sleep(0.1)
    after = await stack.store.digest()
    return [
        Check(
            "broker reset stops the projectors",
            all(stopped) and late.returncode == ExitStatus.LOG_MISMATCH,
            f"running projectors exited with {[p.returncode for p in projectors]}, one "
            f"started after the reset with {late.returncode} (4: the log-identity error)",
        ),
        Check(
            "runtimes fail closed after a broker reset",
            failed_closed,
            "a run started after the reset ended "
            + (
                f"{results[0].get('status')} ({str(results[0].get('detail'))[:90]})"
                if results
                else "without a result"
            )
            + "; no request reached billing",
        ),
        Check(
            "nothing in PostgreSQL lost in a broker reset",
            after == before,
            f"ledger digest {before[:16]} before, {after[:16]} after",
        ),
    ]
