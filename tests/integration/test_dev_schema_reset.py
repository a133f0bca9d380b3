"""`dev down` then `dev up` on tansu, and the checkout's ledger schema (issue 42, item 5).

tansu keeps nothing across a restart, so the new broker has none of the log the checkout's
schema was built from; the projector refused that schema (exit status 4, "project the new log
into a new, empty ledger schema") and the dev loop was stuck until someone dropped it by hand.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from tests.integration.procs import Procs

_CLI = [sys.executable, "-c", "from toolledger.cli import main; main()", "dev"]


def _exports(out: str) -> dict[str, str]:
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in out.splitlines()
        if line.startswith("export ") and "$(" not in line
    )


async def _schema_exists(dsn: str, schema: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema)
        return found is not None
    finally:
        await conn.close()


async def _drop(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def test_dev_up_resets_a_schema_bound_to_a_log_the_new_broker_does_not_hold(
    tmp_path: Path, pg_dsn: str
) -> None:
    """After `dev down` and `dev up` a projector could not start: the checkout's schema was
    bound to the lost log. `dev up` must notice, reset that schema, say so, and a projector
    must then start; a `dev up` that finds the log intact must leave the schema alone."""
    (tmp_path / "pyproject.toml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env["TOOLLEDGER_DATABASE_URL"] = pg_dsn

    def dev(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_CLI, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    procs = Procs(tmp_path)
    schema = ""
    try:
        first = dev("up", "--kafka", "tansu")
        assert first.returncode == 0, first.stderr
        exports = _exports(first.stdout)
        schema = exports["TOOLLEDGER_SCHEMA"]
        projector = procs.projector("projector-1", exports)
        await projector.wait_for(r"owns \[", timeout=60)
        projector.kill()
        again = dev("up")
        assert again.returncode == 0 and "Reset the dev ledger schema" not in again.stdout
        assert dev("down").returncode == 0
        restarted = dev("up", "--kafka", "tansu")
        assert restarted.returncode == 0, restarted.stderr
        assert f"Reset the dev ledger schema {schema}" in restarted.stdout, restarted.stdout
        assert not await _schema_exists(pg_dsn, schema)
        projector = procs.projector("projector-2", _exports(restarted.stdout))
        await projector.wait_for(r"owns \[", timeout=60)
    finally:
        procs.close()
        dev("down")
        if schema:
            await asyncio.wait_for(_drop(pg_dsn, schema), 30)
