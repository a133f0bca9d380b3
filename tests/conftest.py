"""Session services and per-test isolation (schemas, topic names).

Minimal placeholder: the dev-stack helper replaces the internals; the fixture names and types are
the contract other tests rely on.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    return os.environ["TOOLLEDGER_DATABASE_URL"]


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return os.environ["TOOLLEDGER_KAFKA_BOOTSTRAP"]


@pytest.fixture
async def pg_schema(pg_dsn: str) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
        yield name
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"
