"""Tools for the reconciler tests, imported by the test and by `toolledger reconciler --tools`.

The reconciler runs in its own process (`python -m toolledger reconciler --tools
tests.integration.reconcile_tools`), so its hooks find the billing system the way the test does:
through `TOOLLEDGER_TEST_BILLING`, the path of a SQLite file both processes open
(`tests.fake_billing.FakeBilling`). The same file journals every hook call (which process, key
and attempt, when it started and ended), so a test can see a lookup in flight, count how often a
key was asked, and tell the answers of a killed process from those of its successor.

`find_credit` waits while the hold file (`<billing>.hold`) exists, so a test can act while a
lookup is in flight; `TOOLLEDGER_TEST_LOOKUP_DELAY` slows every lookup down.

- `recon.issue_credit`: a credit passed the idempotency key, reconcilable by it. With
  `answer_lost=True` the credit is made and the answer never comes back (indeterminate).
- `recon.post_letter`: its hook can never tell (the post office keeps no record).
- `recon.wire_money`: no hook at all; its unknown calls wait for an operator.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

from tests.fake_billing import Credit, FakeBilling
from toolledger import ReconcileOutcome, ToolContext, ToolExecutionRecord, Toolset, external

BILLING_ENV = "TOOLLEDGER_TEST_BILLING"
DELAY_ENV = "TOOLLEDGER_TEST_LOOKUP_DELAY"

recon = Toolset("recon")


def billing() -> FakeBilling:
    return FakeBilling(Path(os.environ[BILLING_ENV]))


def hold_path(billing_path: Path) -> Path:
    """While this file exists, `find_credit` lookups wait before answering."""
    return billing_path.with_suffix(".hold")


class Journal:
    """Every hook call, in the billing file: `lookups(key, pid, attempt, started, ended)`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS lookups (n INTEGER PRIMARY KEY, key TEXT, pid INTEGER,"
                " attempt INTEGER, started REAL, ended REAL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10, isolation_level=None)

    def start(self, key: str, attempt: int) -> int:
        with self._connect() as db:
            cursor = db.execute(
                "INSERT INTO lookups (key, pid, attempt, started) VALUES (?, ?, ?, ?)",
                (key, os.getpid(), attempt, time.time()),
            )
            return int(cursor.lastrowid or 0)

    def end(self, n: int) -> None:
        with self._connect() as db:
            db.execute("UPDATE lookups SET ended = ? WHERE n = ?", (time.time(), n))

    def rows(self, key: str | None = None) -> list[tuple[str, int, int, float, float | None]]:
        """(key, pid, attempt, started, ended) in the order the lookups started."""
        query = "SELECT key, pid, attempt, started, ended FROM lookups"
        with self._connect() as db:
            if key is None:
                return list(db.execute(query + " ORDER BY n"))
            return list(db.execute(query + " WHERE key = ? ORDER BY n", (key,)))

    def in_flight(self, pid: int) -> list[str]:
        """Keys `pid` is looking up right now."""
        return [k for k, p, _, _, ended in self.rows() if p == pid and ended is None]


async def find_credit(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    """Look the credit up by the call's idempotency key."""
    path = Path(os.environ[BILLING_ENV])
    journal = Journal(path)
    n = journal.start(record.key, context.attempt)
    try:
        await asyncio.sleep(float(os.environ.get(DELAY_ENV, "0")))
        # A file, not an asyncio.Event: the test process that removes it is another process.
        while hold_path(path).exists():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        credit = await billing().find_credit(context.idempotency_key)
    finally:
        journal.end(n)
    if credit is None:
        return ReconcileOutcome(status="unknown", detail="no credit under this key yet")
    return ReconcileOutcome(status="completed", value=credit, result_reference=credit.credit_id)


@recon.tool(external(), reconcile=find_credit, timeout=0.5)
async def issue_credit(
    account_id: str, amount_cents: int, *, answer_lost: bool = False, context: ToolContext
) -> Credit:
    """Credit an account under the call's idempotency key."""
    async with context.sending():
        credit = await billing().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
        if answer_lost:
            await asyncio.sleep(3600)  # the connection hangs: the tool times out
    return credit


async def ask_post_office(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    """The post office keeps no record of letters: never sure."""
    journal = Journal(Path(os.environ[BILLING_ENV]))
    journal.end(journal.start(record.key, context.attempt))
    return ReconcileOutcome(status="unknown", detail="the post office keeps no record")


@recon.tool(external(), reconcile=ask_post_office, timeout=0.5)
async def post_letter(address: str, context: ToolContext) -> str:
    """Post a letter."""
    async with context.sending():
        return f"posted to {address}"


@recon.tool(external(), timeout=0.5)
async def wire_money(iban: str, amount_cents: int, context: ToolContext) -> str:
    """Wire money; nobody can look a transfer up afterwards."""
    async with context.sending():
        return f"wired {amount_cents} to {iban}"
