"""The drill's operator: works the operator queue, and checks that the queue hides nothing.

Every pass lists the tenant's unsettled calls through `OperatorService.list_calls`, the service
the HTTP API and `toolledger executions list` answer from, page by page:

- **The listing check.** The unsettled calls are also read straight from PostgreSQL, once
  before and once after the listing. A call unsettled at the same version both times did not
  change while the listing ran, so the listing must contain it; one that is missing is a
  violation (an operator would never see that call). Calls that changed in between prove
  nothing either way and are not judged.
- **Settling.** Calls of `drill.transfer`, the tool without a reconcile hook, can only be
  settled by a person. The operator does what a person would: once the call is past its
  deadline (plus the clock-skew grace, before which the ledger refuses), it looks the key up in
  billing (voiding it if there is no credit, so the answer stays true) and resolves the call
  `completed` with the credit as its value, or `failed`, with the evidence as the reason.
  Only calls the listing showed are settled: a call the listing missed would hold its run
  forever, and the drill would time out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from toolledger.api.errors import Conflict, OperatorError
from toolledger.api.service import Operator, OperatorService
from toolledger.drill.billing import DrillBilling
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.drill.model import TENANT
from toolledger.errors import LedgerUnavailable
from toolledger.events.lifecycle import open_until
from toolledger.events.models import utcnow
from toolledger.events.records import UNSETTLED, CallRecord
from toolledger.projections.dberrors import DATABASE_ERRORS

log = logging.getLogger("toolledger.drill")

#: The tool whose unknown calls only an operator settles.
OPERATOR_TOOL = "drill.transfer"


@dataclass
class ListingChecks:
    """What the listing checks found: how many passes were judged, and any call missed."""

    passes: int = 0
    judged: int = 0
    missing: set[str] = field(default_factory=set)


class DrillOperator:
    """Lists the queue, checks the listing, settles what only an operator can."""

    def __init__(self, service: OperatorService, db: LedgerDB, billing: DrillBilling) -> None:
        self.service = service
        self.db = db
        self.billing = billing
        self.who = Operator(TENANT, "drill-operator")
        self.checks = ListingChecks()
        self.settled = 0

    async def listed(self) -> dict[str, CallRecord]:
        """Every unsettled call of the tenant, as the operator API lists them."""
        calls: dict[str, CallRecord] = {}
        cursor = None
        while True:
            page = await self.service.list_calls(
                self.who, statuses=UNSETTLED, limit=500, cursor=cursor
            )
            calls.update((c.key, c) for c in page.items)
            if page.next_cursor is None:
                return calls
            cursor = page.next_cursor

    async def check_listing(self) -> dict[str, CallRecord]:
        """One judged listing (see the module docstring); returns the listed calls."""
        before = await self.db.unsettled(TENANT)
        listed = await self.listed()
        after = await self.db.unsettled(TENANT)
        stable = {key for key, version in before.items() if after.get(key) == version}
        self.checks.passes += 1
        self.checks.judged += len(stable)
        missing = {key for key in stable if key not in listed or listed[key].version != before[key]}
        if missing:
            log.error("unsettled calls missing from the operator listing: %s", sorted(missing))
            self.checks.missing |= missing
        return listed

    async def work(self) -> None:
        """One pass: check the listing, then settle the overdue calls of the hookless tool."""
        try:
            listed = await self.check_listing()
            for record in listed.values():
                if record.tool == OPERATOR_TOOL and utcnow() > open_until(record):
                    await self._settle(record)
        except (LedgerUnavailable, OperatorError) as exc:
            log.info("operator pass interrupted (%s); trying again", exc)
        except DATABASE_ERRORS as exc:
            log.info("operator pass interrupted (%s); trying again", exc)

    async def _settle(self, record: CallRecord) -> None:
        credit = self.billing.lookup(record.key, void=True)
        try:
            if credit is not None:
                await self.service.resolve(
                    self.who,
                    record.key,
                    outcome="completed",
                    reason=f"credit {credit.credit_id} found in billing under this key",
                    value=credit.model_dump(),
                    result_reference=credit.credit_id,
                    expected_version=record.version,
                )
            else:
                await self.service.resolve(
                    self.who,
                    record.key,
                    outcome="failed",
                    reason="no credit under this key in billing, and billing voided the key",
                    expected_version=record.version,
                )
        except Conflict:
            return  # it moved on meanwhile (its runtime or an earlier pass settled it)
        self.settled += 1
