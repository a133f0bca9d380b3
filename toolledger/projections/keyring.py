"""The ledger's registered public keys in PostgreSQL (table `verify_keys`, migration 0005).

Each projector registers the public keys it verifies with when it starts, after checking them
against those already registered (`toolledger.events.signing.check_key_set`): every projector of
one ledger then provably holds the same key set, growing only by addition. The operator API
reads the set to tell, before it signs, whether any projector would know its key id. The fold
never reads this table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    _Connection = asyncpg.Connection[Any] | PoolConnectionProxy[Any]
    _Queries = _Connection | asyncpg.Pool[Any]

from toolledger.events.signing import VerifyKeys, check_key_set

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('toolledger.verify_keys', 0))"
_SELECT = "SELECT key_id, public_key FROM verify_keys ORDER BY registered_at, key_id"
_INSERT = "INSERT INTO verify_keys (key_id, public_key) VALUES ($1, $2) ON CONFLICT DO NOTHING"


async def registered(conn: _Queries) -> VerifyKeys:
    rows = await conn.fetch(_SELECT)
    return VerifyKeys({row["key_id"]: bytes(row["public_key"]) for row in rows})


async def register(conn: _Connection, keys: VerifyKeys) -> VerifyKeys:
    """Check `keys` against the registered set and add the new ones; the set afterwards."""
    async with conn.transaction():
        await conn.execute(_LOCK)
        check_key_set(keys, await registered(conn))
        await conn.executemany(_INSERT, list(keys.raw.items()))
        return await registered(conn)
