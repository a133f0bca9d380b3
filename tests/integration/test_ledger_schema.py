"""Only what builds the ledger creates its PostgreSQL schema: a mistyped TOOLLEDGER_SCHEMA is
refused by everything that only reads or appends, with the command that creates it.

A read-only `toolledger executions list` against `nosuchschema` once created and migrated the
whole ledger there, showed an empty queue and exited 0; `Ledger.connect()` did the same. Now
the projector, `toolledger server` and `toolledger migrate` create a schema; the rest exit 2.
"""

from __future__ import annotations

import os

import asyncpg
import pytest

from tests import builders as b
from tests.integration.procs import run_toolledger_async
from tests.isolated import Isolated, child_env
from toolledger import Ledger, errors
from toolledger.settings import Settings


async def _ledger_exists(isolated: Isolated, schema: str) -> bool:
    """Whether `schema` holds a ledger (the test's own schema exists from the start, empty)."""
    conn = await asyncpg.connect(isolated.database_url)
    try:
        found = await conn.fetchval("SELECT to_regclass($1)", f'"{schema}".schema_migrations')
    finally:
        await conn.close()
    return found is not None


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    signing = {"TOOLLEDGER_SIGNING_KEYS": b.SIGNING_KEY.setting()}  # `executions` asks for it
    return {**env, **child_env(settings), **signing, "COLUMNS": "200"}


async def test_a_read_only_command_refuses_a_schema_that_does_not_exist(
    isolated: Isolated,
) -> None:
    """`executions list` must not create the schema it was pointed at by mistake: exit 2, say
    which setting and which command creates it, and leave the database as it was."""
    typo = f"{isolated.schema}_typo"
    settings = Settings(**{**isolated.connection(), "schema_name": typo})
    code, out, err = await run_toolledger_async(_env(settings), "executions", "list")
    assert code == 2, (out, err)
    assert f"ledger schema {typo!r} does not exist" in err
    assert "TOOLLEDGER_SCHEMA" in err and "`toolledger migrate`" in err
    assert "Unclosed" not in err
    assert not await _ledger_exists(isolated, typo)


async def test_a_runtime_refuses_it_and_migrate_creates_it(isolated: Isolated) -> None:
    """`Ledger.connect()` is a runtime: it reads and appends, it does not build the ledger.
    `toolledger migrate` does, after which the same runtime connects."""
    settings = isolated.settings(Settings)
    with pytest.raises(errors.SchemaMissing, match="toolledger migrate"):
        await Ledger.connect(settings)
    assert not await _ledger_exists(isolated, isolated.schema)

    code, out, err = await run_toolledger_async(_env(settings), "migrate")
    assert code == 0, (out, err)
    assert isolated.schema in out
    assert await _ledger_exists(isolated, isolated.schema)
    code, out, err = await run_toolledger_async(_env(settings), "migrate")
    assert code == 0 and "up to date" in out, (out, err)
    async with await Ledger.connect(settings) as ledger:
        assert await ledger.read_call("r1:c1") is None
