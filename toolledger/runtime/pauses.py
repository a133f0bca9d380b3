"""When a paused run may go on: one rule for the SDK's `resumable_runs` and the resumer process.

A run driven by `AgentRun` pauses (`awaiting_reconciliation`, `awaiting_approval`,
`duplicate_intent`) on one call, `waiting_on`. It may be resumed once that call is settled, or
decided for an approval; a contested `failed` call is not settled (an operator must decide it
again). Hosts that resume runs themselves poll `resumable_runs`; the `toolledger resumer`
(`toolledger.processors.resumer`) applies `wait_is_over` to the facts topic instead. This module
imports nothing of the driver, so the resumer does not load the SDK's run loop to ask.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from typing import Protocol

from toolledger.events.records import UNSETTLED, CallRecord, RunRecord

PAUSED = ("awaiting_reconciliation", "awaiting_approval", "duplicate_intent")


def wait_is_over(run: RunRecord, call: CallRecord | None) -> bool:
    """Whether a paused run's awaited call is settled (or decided, for an approval)."""
    if run.status not in PAUSED or run.waiting_on is None:
        return False
    if call is None:
        return False
    if run.status == "awaiting_approval":
        return call.status != "awaiting_approval"
    return call.status not in UNSETTLED and not (call.contested and call.status == "failed")


class PausedRunReads(Protocol):
    """The two reads `resumable_runs` needs: a `Ledger` or a `RuntimePort` has them."""

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]: ...

    async def read_call(self, key: str) -> CallRecord | None: ...


async def resumable_runs(
    ledger: PausedRunReads,
    *,
    tenant_id: str | None = None,
    poll_interval: float = 0.2,
    follow: bool = True,
) -> AsyncIterator[RunRecord]:
    """Paused runs whose awaited call was settled, as they become resumable.

    For hosts that resume runs themselves (the `toolledger resumer` process does the same from
    the facts topic). Each run is yielded once per pause; resuming it is the host's job
    (`AgentRun(...).resume()`), and a run resumed elsewhere in the meantime is fenced by its
    checkpoint, so yielding a run to two hosts is safe. With `follow=False` the iterator ends
    after one pass.
    """
    yielded: set[tuple[str, str | None, object]] = set()
    while True:
        runs = await ledger.list_runs(PAUSED, tenant_id=tenant_id)
        for run in runs:
            mark = (run.run_id, run.waiting_on, run.updated_at)
            if mark in yielded:
                continue
            call = await ledger.read_call(run.waiting_on) if run.waiting_on else None
            if wait_is_over(run, call):
                yielded.add(mark)
                yield run
        if not follow:
            return
        await asyncio.sleep(poll_interval)
