"""Ordered plain-SQL migrations and the tiny runner that applies them.

Each file in `migrations/` is `NNNN_name.sql`; version NNNN is applied once per schema and
recorded in `schema_migrations`. Plain SQL keeps the schema readable by a DBA and by `psql`,
with no ORM in between. The runner takes a transaction-scoped advisory lock derived from the
schema name, so two processes starting together serialize: the second waits, then finds the
versions already recorded and applies nothing. Pending migrations and their version rows commit
together; a failing file leaves the schema as it was.

All objects live in one schema (`toolledger` in production, a fresh one per test): the runner
sets `search_path` for its transaction and the SQL files stay unqualified.

Only what builds the ledger creates the schema (`create=True`: the projector, `toolledger
server`, `toolledger migrate`, a replay into a new schema). Everything else (runtimes, the API,
the CLI's reads) passes `create=False` and gets `SchemaMissing` for a schema that holds no
ledger, so a mistyped `TOOLLEDGER_SCHEMA` is an error naming the setting, not a new, empty
ledger that answers every question with "nothing". An existing ledger still gets its pending
migrations from whoever starts first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from toolledger.errors import ToolLedgerError

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    Conn: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class SchemaMissing(ToolLedgerError):
    """The ledger's schema does not exist (or holds no ledger), and this process does not
    create one: the setting is wrong, or nothing built the ledger yet."""

    code = "schema_missing"

    def __init__(self, schema: str) -> None:
        super().__init__(
            f"the ledger schema {schema!r} does not exist in this database "
            "(TOOLLEDGER_SCHEMA): check the setting, or create the ledger with "
            "`toolledger migrate` (`toolledger projector` and `toolledger server` create it "
            "too when they start)"
        )
        self.schema = schema


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def check_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain identifier; quoting rules stay out of every query."""
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(
            f"ledger schema name {schema!r} must be a letter or '_' followed by up to 62 "
            "letters, digits or '_'"
        )
    return schema


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in version order; versions must run 1, 2, 3... without gaps."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ValueError(f"migration file {path} is not named NNNN_lowercase_name.sql")
        found.append(Migration(int(match.group(1)), path.name, path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations in {directory} must be numbered 1..n, found {versions}")
    return found


async def migrate(
    conn: Conn, schema: str, migrations: list[Migration] | None = None, *, create: bool = True
) -> list[int]:
    """Apply the pending migrations to `schema`; return their versions. A schema that does
    not exist, or holds no ledger, is created with `create`, else `SchemaMissing`."""
    check_schema_name(schema)
    pending = load_migrations() if migrations is None else migrations
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            f"toolledger.migrations:{schema}",
        )
        # Checked before CREATE SCHEMA because that needs the CREATE privilege even when the
        # schema exists, and a deployment may grant only usage on a schema a DBA made.
        exists = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
        if not create:
            ledger = await conn.fetchval(
                "SELECT to_regclass($1)", f"{quote_ident(schema)}.schema_migrations"
            )
            if exists is None or ledger is None:
                raise SchemaMissing(schema)
        if exists is None:
            await conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
        await conn.execute("SELECT set_config('search_path', $1, true)", quote_ident(schema))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = await conn.fetch("SELECT version FROM schema_migrations")
        applied = {int(row["version"]) for row in rows}
        done: list[int] = []
        for migration in pending:
            if migration.version in applied:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version) VALUES ($1)", migration.version
            )
            done.append(migration.version)
    return done
