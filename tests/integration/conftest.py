"""Fixtures the tests on Kafka + PostgreSQL share (see also `tests/conftest.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.procs import Procs
from toolledger.api.tokens import PostgresTokens


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[Procs]:
    """Child processes of this test, every one stopped by pid when it ends."""
    started = Procs(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
async def tokens(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresTokens]:
    """API tokens stored in this test's schema."""
    store = PostgresTokens(pg_dsn, pg_schema)
    await store.start()
    try:
        yield store
    finally:
        await store.close()
