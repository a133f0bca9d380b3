"""Bearer tokens for the operator API: issued once, stored hashed, scoped, expiring, revocable.

A token is `tlk_` plus 32 random bytes (URL-safe base64). Only its SHA-256 is stored, so the
table cannot be replayed as credentials if it leaks; the token itself is printed once, by
`toolledger tokens create`, and never again. Each token names one tenant, one operator id (what
the ledger records as the person who decided) and one role, and expires. `token_id`, a prefix of
the hash, is the public name used to list and revoke it.

`TokenStore` is the port; `PostgresTokens` keeps tokens in the ledger's schema (table
`api_tokens`, migration 0002) and `MemoryTokens` is the twin for the embedded ledger and tests.
`authenticate` is shared by both, so "expired", "revoked" and "unknown" mean the same everywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args

from toolledger.errors import ToolLedgerError
from toolledger.events.models import utcnow
from toolledger.projections.migrations import check_schema_name, migrate, quote_ident

if TYPE_CHECKING:
    import asyncpg

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
#: What each role may do, in order: a role may do everything the roles before it may.
_RANK: dict[Role, int] = {role: rank for rank, role in enumerate(ROLES)}

#: Marks a string as a toolledger API token (for secret scanners and people); not a secret.
TOKEN_PREFIX = "tlk_"  # noqa: S105


def role_allows(role: Role, needed: Role) -> bool:
    """Whether `role` may do what `needed` may (viewer < operator < admin)."""
    return _RANK[role] >= _RANK[needed]


def hash_token(token: str) -> str:
    """The SHA-256 hex digest stored for `token`."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenRecord:
    """A stored token: everything but the token itself."""

    token_id: str
    tenant_id: str
    operator: str
    role: Role
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None = None

    def state(self, now: datetime) -> Literal["active", "expired", "revoked"]:
        if self.revoked_at is not None:
            return "revoked"
        if now >= self.expires_at:
            return "expired"
        return "active"


@dataclass(frozen=True)
class IssuedToken:
    """A new token: `token` is shown once and is not stored."""

    token: str
    record: TokenRecord


class TokenRejected(ToolLedgerError):
    """A presented token cannot be used; `code` says why (missing, unknown, expired, revoked)."""

    code = "token_rejected"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def new_token(
    tenant_id: str, operator: str, role: Role, ttl: timedelta, now: datetime
) -> tuple[IssuedToken, str]:
    """A fresh token and the hash to store for it."""
    if not tenant_id or not operator:
        raise ValueError("a token needs a tenant and an operator id")
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if ttl <= timedelta(0):
        raise ValueError(f"a token needs a positive time to live, not {ttl}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    digest = hash_token(token)
    record = TokenRecord(
        token_id=digest[:16],
        tenant_id=tenant_id,
        operator=operator,
        role=role,
        created_at=now,
        expires_at=now + ttl,
    )
    return IssuedToken(token=token, record=record), digest


def check_usable(record: TokenRecord | None, now: datetime) -> TokenRecord:
    """`record` if it may authenticate a request at `now`; `TokenRejected` saying why not."""
    if record is None:
        raise TokenRejected(
            "invalid_token",
            "the bearer token is not known to this ledger; create one with "
            "`toolledger tokens create --tenant ... --operator ... --role ...`",
        )
    match record.state(now):
        case "revoked":
            assert record.revoked_at is not None
            raise TokenRejected(
                "token_revoked",
                f"token {record.token_id} was revoked at {record.revoked_at.isoformat()}; "
                "ask an admin for a new one",
            )
        case "expired":
            raise TokenRejected(
                "token_expired",
                f"token {record.token_id} expired at {record.expires_at.isoformat()}; "
                "ask an admin for a new one",
            )
        case "active":
            return record


class TokenStore(ABC):
    """Where tokens live. Only hashes are stored; `authenticate` takes the token itself."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def _insert(self, record: TokenRecord, digest: str) -> None: ...

    @abstractmethod
    async def _by_hash(self, digest: str) -> TokenRecord | None: ...

    @abstractmethod
    async def list_tokens(self, tenant_id: str | None = None) -> list[TokenRecord]:
        """Every token (of one tenant), oldest first, revoked and expired ones included."""

    @abstractmethod
    async def revoke(self, token_id: str, now: datetime | None = None) -> TokenRecord | None:
        """Revoke the token (idempotent: a second revoke keeps the first time); None if unknown."""

    async def create(
        self, tenant_id: str, operator: str, role: Role, ttl: timedelta, now: datetime | None = None
    ) -> IssuedToken:
        """Issue a token; the returned `token` is the only copy there will ever be."""
        issued, digest = new_token(tenant_id, operator, role, ttl, now or utcnow())
        await self._insert(issued.record, digest)
        return issued

    async def authenticate(self, token: str, now: datetime | None = None) -> TokenRecord:
        """The token's record if it is known, not revoked and not expired; else `TokenRejected`."""
        return check_usable(await self._by_hash(hash_token(token)), now or utcnow())

    async def authenticate_digest(self, digest: str, now: datetime | None = None) -> TokenRecord:
        """`authenticate` for a caller that kept only the token's hash: the console's sessions
        re-check their token on every request, so a revoked or expired token ends them."""
        return check_usable(await self._by_hash(digest), now or utcnow())


class MemoryTokens(TokenStore):
    """Tokens in a dict: the embedded ledger's twin of `PostgresTokens`."""

    def __init__(self) -> None:
        self._by_digest: dict[str, TokenRecord] = {}

    async def start(self) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        """Nothing to release."""

    async def _insert(self, record: TokenRecord, digest: str) -> None:
        self._by_digest[digest] = record

    async def _by_hash(self, digest: str) -> TokenRecord | None:
        return self._by_digest.get(digest)

    async def list_tokens(self, tenant_id: str | None = None) -> list[TokenRecord]:
        found = (r for r in self._by_digest.values() if tenant_id in (None, r.tenant_id))
        return sorted(found, key=lambda r: (r.created_at, r.token_id))

    async def revoke(self, token_id: str, now: datetime | None = None) -> TokenRecord | None:
        for digest, record in self._by_digest.items():
            if record.token_id == token_id:
                if record.revoked_at is None:
                    record = replace(record, revoked_at=now or utcnow())
                    self._by_digest[digest] = record
                return record
        return None


# The f-strings below only splice in this constant column list, never input (hence S608).
_COLUMNS = "token_id, tenant_id, operator, role, created_at, expires_at, revoked_at"
_INSERT = (
    f"INSERT INTO api_tokens ({_COLUMNS}, token_hash) "  # noqa: S608
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
)
_BY_HASH = f"SELECT {_COLUMNS} FROM api_tokens WHERE token_hash = $1"  # noqa: S608
_LIST = f"SELECT {_COLUMNS} FROM api_tokens WHERE $1::text IS NULL OR tenant_id = $1 "  # noqa: S608
_REVOKE = (
    "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, $2) WHERE token_id = $1 "  # noqa: S608
    f"RETURNING {_COLUMNS}"
)


def _record(row: asyncpg.Record | dict[str, Any]) -> TokenRecord:
    return TokenRecord(**dict(row))


class PostgresTokens(TokenStore):
    """Tokens in the ledger's PostgreSQL schema (`api_tokens`), behind a small pool.

    The pool is opened on first use as well as by `start()`, because an ASGI app built outside
    a server (tests, `httpx.ASGITransport`) never runs its startup hooks. With `create=False`
    (the CLI, the API) a schema that holds no ledger is `SchemaMissing`, not created.
    """

    def __init__(
        self, dsn: str, schema: str = "toolledger", *, pool_size: int = 2, create: bool = True
    ) -> None:
        self._dsn = dsn
        self._create = create
        self._schema = check_schema_name(schema)
        self._pool_size = pool_size
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._opening = asyncio.Lock()

    async def start(self) -> None:
        await self._db()

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def _db(self) -> asyncpg.Pool[asyncpg.Record]:
        import asyncpg  # here: `toolledger tokens --help` reads `ROLES` and must stay light

        async with self._opening:
            if self._pool is None:
                pool = await asyncpg.create_pool(
                    self._dsn,
                    min_size=1,
                    max_size=self._pool_size,
                    server_settings={"search_path": quote_ident(self._schema)},
                )
                try:
                    async with pool.acquire() as conn:
                        await migrate(conn, self._schema, create=self._create)
                except BaseException:
                    await pool.close()
                    raise
                self._pool = pool
            return self._pool

    async def _insert(self, record: TokenRecord, digest: str) -> None:
        db = await self._db()
        await db.execute(
            _INSERT,
            record.token_id,
            record.tenant_id,
            record.operator,
            record.role,
            record.created_at,
            record.expires_at,
            record.revoked_at,
            digest,
        )

    async def _by_hash(self, digest: str) -> TokenRecord | None:
        row = await (await self._db()).fetchrow(_BY_HASH, digest)
        return None if row is None else _record(row)

    async def list_tokens(self, tenant_id: str | None = None) -> list[TokenRecord]:
        rows = await (await self._db()).fetch(_LIST + "ORDER BY created_at, token_id", tenant_id)
        return [_record(row) for row in rows]

    async def revoke(self, token_id: str, now: datetime | None = None) -> TokenRecord | None:
        row = await (await self._db()).fetchrow(_REVOKE, token_id, now or utcnow())
        return None if row is None else _record(row)
