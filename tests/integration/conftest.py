"""Fixtures the operator-API tests on Kafka + PostgreSQL share (see also `tests/conftest.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from toolledger.api.tokens import PostgresTokens


@pytest.fixture
async def tokens(pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresTokens]:
    """API tokens stored in this test's schema."""
    store = PostgresTokens(pg_dsn, pg_schema)
    await store.start()
    try:
        yield store
    finally:
        await store.close()
