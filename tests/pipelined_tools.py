"""Pipelined billing tools (`external(pipelined=True)`) on the fake billing system.

Declared at module level, like `tests/fake_billing.py`'s, so that a worker process
(`tests/integration/pipelined_worker.py`) declares exactly the tools the test process does. The
fake billing system honours idempotency keys and counts every request and every effect: a
pipelined call may reach it twice, and it must still make one credit.

`stall` is how a test stops a tool right after its credit was made, as a crash would find it:
the tool sets `stall.entered` (and writes `stall.marker`, for a test in another process), then
waits until its process is killed or its task cancelled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from tests.fake_billing import Credit, find_credit, service
from toolledger import ToolContext, Toolset, external

pipelined = Toolset("pipelined")


@dataclass
class Stall:
    """Where a stalling tool says it has made its credit."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    marker: Path | None = None

    def reset(self) -> None:
        self.entered = asyncio.Event()
        self.marker = None


stall = Stall()


async def _credit(account_id: str, amount_cents: int, idempotency_key: str) -> Credit:
    return await service().credit(account_id, amount_cents, idempotency_key=idempotency_key)


@pipelined.tool(external(pipelined=True), reconcile=find_credit)
async def credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A pipelined credit, reconcilable by its idempotency key."""
    async with context.sending():
        return await _credit(account_id, amount_cents, context.idempotency_key)


@pipelined.tool(external(pipelined=True))
async def credit_unreconciled(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """The same credit with no reconcile hook: an unknown call waits for an operator."""
    async with context.sending():
        return await _credit(account_id, amount_cents, context.idempotency_key)


@pipelined.tool(external(pipelined=True), reconcile=find_credit)
async def credit_then_stall(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Makes the credit, then stalls (see `stall`) until killed or cancelled."""
    async with context.sending():
        await _credit(account_id, amount_cents, context.idempotency_key)
        if stall.marker is not None:
            stall.marker.write_text(context.idempotency_key)
        stall.entered.set()
        await asyncio.Event().wait()
    raise AssertionError("unreachable: the test kills this tool")


@pipelined.tool(external(pipelined=True), timeout=0.3)
async def credit_then_time_out(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Makes the credit, then the answer never comes: indeterminate after 0.3 s."""
    async with context.sending():
        await _credit(account_id, amount_cents, context.idempotency_key)
        await asyncio.Event().wait()
    raise AssertionError("unreachable: the tool times out")
