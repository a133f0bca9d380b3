"""`toolledger migrate`: create the ledger's PostgreSQL schema, or bring its tables up to date.

Only what builds the ledger creates its schema: this command, `toolledger projector` and
`toolledger server`. Every other command, the API and `Ledger.connect()` refuse a schema that
does not exist (`SchemaMissing`, exit status 2), so a mistyped `TOOLLEDGER_SCHEMA` is an error
naming the setting, never a new, empty ledger that answers "nothing" to every question. Run it
once before the first runtime or API starts against a new database; running it again applies
only what is pending (nothing, usually). It needs PostgreSQL only, not Kafka.
"""

from __future__ import annotations

import asyncio

import click

from toolledger.cli.entry import console


async def _migrate() -> tuple[str, list[int], int]:
    import asyncpg

    from toolledger.errors import ConfigError
    from toolledger.projections.migrations import load_migrations, migrate
    from toolledger.settings import load_settings

    settings = load_settings()
    if not settings.database_url:
        raise ConfigError(
            "TOOLLEDGER_DATABASE_URL must be set (or run `toolledger dev up` for a local stack)"
        )
    conn = await asyncpg.connect(settings.database_url)
    try:
        done = await migrate(conn, settings.schema_name, create=True)
    finally:
        await conn.close()
    return settings.schema_name, done, load_migrations()[-1].version


@click.command()
def migrate() -> None:
    """Create the ledger's PostgreSQL schema (TOOLLEDGER_SCHEMA) or apply pending migrations."""
    schema, done, latest = asyncio.run(_migrate())
    if done:
        applied = ", ".join(str(v) for v in done)
        console().print(f"ledger schema {schema}: applied migrations {applied}; now at {latest}")
    else:
        console().print(f"ledger schema {schema}: up to date (migration {latest})")
