"""The drill's billing system: a fake that honours idempotency keys, counts effects, and is the
judge of "one effect".

It is a SQLite file, so every process of a drill (runtime workers, the reconciler, the drill's
operator) talks to the same system, and a SIGKILL in the middle of a request leaves it either
made or not (SQLite's journal), never half made. It keeps three things:

- `credits`: the effects, one per idempotency key at most (like Stripe, a repeated key returns
  the first credit instead of making a second). Each credit carries the `memo` the tool sent
  (`<run>/s<step>`), so a second credit for one step under a *new* key, the double charge the
  service cannot see, is visible to the checks.
- `requests`: every request that reached the system, with what became of it (`credited`,
  `replayed`, `refused`). A completed call with two requests ran twice: the service hid the
  second effect, but the ledger broke guarantee 2.
- `voids`: keys fenced off by a lookup. `lookup(key, void=True)` answers "no credit" only after
  making sure none can ever appear (a later request with that key is refused), so a `failed`
  finding based on it is proof, not a guess. A real reconcile hook may answer `failed` only
  when its system gives the same guarantee.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS credits (key TEXT PRIMARY KEY, credit_id TEXT NOT NULL, "
    "account_id TEXT NOT NULL, amount_cents INTEGER NOT NULL, memo TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS requests (n INTEGER PRIMARY KEY, key TEXT NOT NULL, "
    "memo TEXT NOT NULL, outcome TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS voids (key TEXT PRIMARY KEY)",
)


class Credit(BaseModel):
    """What the billing system returns for a credit."""

    credit_id: str
    account_id: str
    amount_cents: int
    memo: str


class KeyVoided(Exception):
    """The key was voided by a lookup: this request is refused and makes no credit."""


@dataclass(frozen=True)
class Effect:
    """One credit as the checks read it: the key it was made under, and its memo."""

    key: str
    credit_id: str
    memo: str


class DrillBilling:
    """Credits by idempotency key in a SQLite file that any process of the drill can open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                db.execute(statement)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def credit(self, account_id: str, amount_cents: int, memo: str, *, key: str) -> Credit:
        """Make the credit once per key; a repeated key gets the first credit back.

        Raises `KeyVoided` (nothing made) if a lookup voided the key. Every request is counted.
        """
        return self.credit_once(account_id, amount_cents, memo, key=key)[0]

    def credit_once(
        self, account_id: str, amount_cents: int, memo: str, *, key: str
    ) -> tuple[Credit, bool]:
        """`credit`, and whether the credit is the key's first one replayed (made earlier)."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT credit_id, account_id, amount_cents, memo FROM credits WHERE key = ?",
                (key,),
            ).fetchone()
            voided = (
                row is None and db.execute("SELECT 1 FROM voids WHERE key = ?", (key,)).fetchone()
            )
            outcome = "replayed" if row is not None else "refused" if voided else "credited"
            db.execute(
                "INSERT INTO requests (key, memo, outcome) VALUES (?, ?, ?)", (key, memo, outcome)
            )
            if row is None and not voided:
                row = (f"cr_{uuid.uuid4().hex[:12]}", account_id, amount_cents, memo)
                db.execute("INSERT INTO credits VALUES (?, ?, ?, ?, ?)", (key, *row))
            db.execute("COMMIT")
        finally:
            db.close()
        if row is None:
            raise KeyVoided(
                f"billing refused the request under {key}: a reconcile lookup voided this key "
                "after finding no credit, so nothing was charged"
            )
        credit = Credit(credit_id=row[0], account_id=row[1], amount_cents=row[2], memo=row[3])
        return credit, outcome == "replayed"

    def lookup(self, key: str, *, void: bool) -> Credit | None:
        """The credit made under `key`, if any. With `void`, a key without a credit is voided
        in the same transaction, so "no credit" stays true forever."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT credit_id, account_id, amount_cents, memo FROM credits WHERE key = ?",
                (key,),
            ).fetchone()
            if row is None and void:
                db.execute("INSERT OR IGNORE INTO voids (key) VALUES (?)", (key,))
            db.execute("COMMIT")
        finally:
            db.close()
        if row is None:
            return None
        return Credit(credit_id=row[0], account_id=row[1], amount_cents=row[2], memo=row[3])

    # -- what the checks read ------------------------------------------------------------------

    def effects(self) -> list[Effect]:
        with self._connect() as db:
            rows = db.execute("SELECT key, credit_id, memo FROM credits").fetchall()
        return [Effect(key, credit_id, memo) for key, credit_id, memo in rows]

    def requests(self) -> dict[str, Counter[str]]:
        """Per key, how many requests reached the system, by outcome."""
        found: dict[str, Counter[str]] = {}
        with self._connect() as db:
            for key, outcome, n in db.execute(
                "SELECT key, outcome, count(*) FROM requests GROUP BY key, outcome"
            ):
                found.setdefault(key, Counter())[outcome] += n
        return found

    def voided(self) -> set[str]:
        with self._connect() as db:
            return {key for (key,) in db.execute("SELECT key FROM voids")}
