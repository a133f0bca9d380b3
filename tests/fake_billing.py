"""A fake billing system that honours idempotency keys and counts effects: judge of "one effect".

It lives in a SQLite file so that several OS processes (the crash and race tests start real
subprocesses) share one system, and it records every request it receives as well as every
effect it makes. Like Stripe, a repeated idempotency key returns the first credit instead of
making a second one; `honour_keys=False` makes it a system with no idempotency support, where
only the ledger stands between a replay and a second effect.

The tests judge with `requests()` (how often a tool reached the system) and `effects()` (how many
credits exist): "one effect" means exactly one credit for the key, and where the ledger itself
must prevent a rerun, exactly one request too.

The tools the scenario tests and the crash worker share are declared here, at module level, so
that the subprocess declares exactly the same tools as the test process.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

from pydantic import BaseModel

from toolledger import ReconcileOutcome, ToolContext, ToolExecutionRecord, Toolset, external


class Credit(BaseModel):
    """What the billing system returns for a credit."""

    credit_id: str
    account_id: str
    amount_cents: int


class FakeBilling:
    """Credits by idempotency key, in a SQLite file any process can open."""

    def __init__(self, path: Path, *, honour_keys: bool = True) -> None:
        self.path = path
        self.honour_keys = honour_keys
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS credits (credit_id TEXT PRIMARY KEY, "
                "idempotency_key TEXT, account_id TEXT, amount_cents INTEGER)"
            )
            db.execute("CREATE TABLE IF NOT EXISTS requests (n INTEGER PRIMARY KEY, key TEXT)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10, isolation_level=None)

    async def credit(self, account_id: str, amount_cents: int, *, idempotency_key: str) -> Credit:
        """Credit the account once per key (if keys are honoured); every request is counted."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO requests (key) VALUES (?)", (idempotency_key,))
            row = None
            if self.honour_keys:
                row = db.execute(
                    "SELECT credit_id, account_id, amount_cents FROM credits "
                    "WHERE idempotency_key = ?",
                    (idempotency_key,),
                ).fetchone()
            if row is None:
                row = (f"cr_{uuid.uuid4().hex[:10]}", account_id, amount_cents)
                db.execute(
                    "INSERT INTO credits VALUES (?, ?, ?, ?)", (row[0], idempotency_key, *row[1:])
                )
            db.execute("COMMIT")
        finally:
            db.close()
        await asyncio.sleep(0)
        return Credit(credit_id=row[0], account_id=row[1], amount_cents=row[2])

    async def find_credit(self, idempotency_key: str) -> Credit | None:
        """The credit made under `idempotency_key`, if any (what a reconcile hook asks)."""
        with self._connect() as db:
            row = db.execute(
                "SELECT credit_id, account_id, amount_cents FROM credits WHERE idempotency_key = ?",
                (idempotency_key,),
            ).fetchone()
        return (
            None
            if row is None
            else Credit(credit_id=row[0], account_id=row[1], amount_cents=row[2])
        )

    def requests(self, key: str | None = None) -> int:
        return self._count("requests", key)

    def effects(self, key: str | None = None) -> int:
        return self._count("credits", key)

    def _count(self, table: str, key: str | None) -> int:
        column = "key" if table == "requests" else "idempotency_key"
        with self._connect() as db:
            if key is None:
                return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # noqa: S608
            query = f"SELECT count(*) FROM {table} WHERE {column} = ?"  # noqa: S608
            return int(db.execute(query, (key,)).fetchone()[0])


_service: FakeBilling | None = None


def use_service(service: FakeBilling) -> FakeBilling:
    """Point the shared tools at `service` (one per test, or per worker process)."""
    global _service
    _service = service
    return service


def service() -> FakeBilling:
    if _service is None:
        raise RuntimeError("call use_service() before running the billing tools")
    return _service


billing = Toolset("billing")


async def find_credit(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    """Look the credit up by the call's idempotency key."""
    credit = await service().find_credit(record.idempotency_key)
    if credit is None:
        return ReconcileOutcome(status="unknown", detail="no credit under this key yet")
    return ReconcileOutcome(status="completed", value=credit, result_reference=credit.credit_id)


@billing.tool(external(), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """Credit an account, passing the idempotency key; reconcilable by key."""
    async with context.sending():
        return await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@billing.tool(external())
async def issue_credit_unreconciled(
    account_id: str, amount_cents: int, context: ToolContext
) -> Credit:
    """The same credit with no reconcile hook: an unknown call can only wait for an operator."""
    async with context.sending():
        return await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )


@billing.tool(external())
async def issue_credit_slowly(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    """A credit that takes a moment after the effect, so two racing callers overlap."""
    async with context.sending():
        credit = await service().credit(
            account_id, amount_cents, idempotency_key=context.idempotency_key
        )
    await asyncio.sleep(0.3)
    return credit
