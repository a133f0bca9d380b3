"""The drill's tools: three ways to credit the drill's billing system, each settled differently.

Imported by the runtime workers and by `toolledger reconciler --tools toolledger.drill.tools`,
so both declare exactly the same tools; they find the billing file through
`TOOLLEDGER_DRILL_BILLING` and the payments API through `TOOLLEDGER_DRILL_PAYMENTS`.

- `drill.charge` has a reconcile hook: an unknown charge is settled by the reconciler (or by a
  resuming runtime, which asks the same hook).
- `drill.transfer` has none: its unknown calls wait in the operator queue until the drill's
  operator settles them through the operator service, as a person would.
- `drill.refund` is an HTTP tool (`toolledger.http`) against the drill's payments API, a
  process of its own (`toolledger.drill.payments`) that keeps its refunds in billing and
  replays its first answer for a repeated key. It declares so
  (`external(replays_key_for=...)`), so an unknown refund is settled by resending the request
  with the same key, by the reconciler or a resuming runtime, and needs neither hook nor
  operator.

All pass the call's idempotency key downstream, and all carry the worker's kill points around
the request: `request_lost` before billing saw the request, `response_lost` after it made the
credit. Outside a worker the points are disabled. A worker may also make some responses slow
(`slow_responses`): the credit is made but comes back after the tool's timeout, so the runtime
itself records the call `indeterminate`, the one unknown no kill produces.
"""

from __future__ import annotations

import asyncio
import os
import random
from datetime import timedelta
from functools import cache
from pathlib import Path

from toolledger import (
    ReconcileOutcome,
    ToolContext,
    ToolExecutionRecord,
    ToolFailedError,
    Toolset,
    external,
)
from toolledger.drill.billing import Credit, DrillBilling, KeyVoided
from toolledger.drill.killpoints import KillPoints
from toolledger.events.lifecycle import open_until
from toolledger.events.models import utcnow
from toolledger.http import ToolHTTP

BILLING_ENV = "TOOLLEDGER_DRILL_BILLING"
PAYMENTS_ENV = "TOOLLEDGER_DRILL_PAYMENTS"
#: How long the payments API replays a key's first answer (it keeps them all; Stripe: 24 h).
REPLAY_WINDOW = timedelta(hours=24)
#: Each tool's timeout, which is also its reservation's budget (one attempt): a call whose
#: runtime died is settled `TOOL_TIMEOUT` + the clock-skew grace after its reservation.
TOOL_TIMEOUT = 1.0

drill = Toolset("drill")
#: The worker replaces this with its own plan; everywhere else nothing is killed.
kill_points = KillPoints.disabled()
#: The share of responses that come back only after the tool's timeout (set by the worker).
slow_responses = 0.0


@cache
def _billing(path: str) -> DrillBilling:
    return DrillBilling(Path(path))


#: The payments API's client. Made at import (the declaration finds it by name), where a forked
#: worker has no drill environment yet: each request names the URL in full (`payments_url`).
payments = ToolHTTP(timeout=TOOL_TIMEOUT, statuses={409: "in_progress"})


def payments_url() -> str:
    url = os.environ.get(PAYMENTS_ENV)
    if not url:
        raise RuntimeError(f"{PAYMENTS_ENV} must name the drill's payments API")
    return url


def billing() -> DrillBilling:
    path = os.environ.get(BILLING_ENV)
    if not path:
        raise RuntimeError(f"{BILLING_ENV} must name the drill's billing file")
    return _billing(path)


async def find_or_void(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    """The credit under the call's key; "failed" only once the key is voided for good.

    Before the call's deadline (plus the clock-skew grace) its runtime may still be sending,
    so no credit only means "not yet": unknown. After it, the lookup voids the key in the same
    transaction, so no credit can appear any more and "failed" is proven.
    """
    overdue = utcnow() > open_until(record) + timedelta(milliseconds=1)
    credit = billing().lookup(context.idempotency_key, void=overdue)
    if credit is not None:
        return ReconcileOutcome(status="completed", value=credit, result_reference=credit.credit_id)
    if overdue:
        return ReconcileOutcome(
            status="failed", detail="no credit under this key, and billing voided the key"
        )
    return ReconcileOutcome(status="unknown", detail="no credit yet; the call may still run")


@drill.tool(external(), reconcile=find_or_void, timeout=TOOL_TIMEOUT)
async def charge(account_id: str, amount_cents: int, memo: str, context: ToolContext) -> Credit:
    """Charge an account once per idempotency key; reconcilable by that key."""
    async with context.sending():
        return await _send(context.idempotency_key, account_id, amount_cents, memo)


@drill.tool(external(), timeout=TOOL_TIMEOUT)
async def transfer(account_id: str, amount_cents: int, memo: str, context: ToolContext) -> Credit:
    """The same charge without a reconcile hook: an unknown one waits for an operator."""
    async with context.sending():
        return await _send(context.idempotency_key, account_id, amount_cents, memo)


@drill.tool(external(replays_key_for=REPLAY_WINDOW), timeout=TOOL_TIMEOUT)
async def refund(account_id: str, amount_cents: int, memo: str, context: ToolContext) -> Credit:
    """The same credit as an HTTP refund; an unknown one is settled by resending it."""
    kill_points.reach("request_lost", context.idempotency_key)
    request = {"charge": account_id, "amount": amount_cents, "memo": memo}
    answer = await payments.post(f"{payments_url()}/v1/refunds", json=request, context=context)
    kill_points.reach("response_lost", context.idempotency_key)
    made = answer.json()
    return Credit(
        credit_id=made["id"], account_id=made["charge"], amount_cents=made["amount"], memo=memo
    )


async def _send(key: str, account_id: str, amount_cents: int, memo: str) -> Credit:
    kill_points.reach("request_lost", key)
    try:
        credit = billing().credit(account_id, amount_cents, memo, key=key)
    except KeyVoided as exc:
        raise ToolFailedError(str(exc)) from None
    if slow_responses and random.random() < slow_responses:
        await asyncio.sleep(2 * TOOL_TIMEOUT)  # the tool times out first: indeterminate
    kill_points.reach("response_lost", key)
    return credit
