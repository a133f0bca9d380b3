"""Who is calling: the bearer token, its tenant, and what its role allows.

Every `/v1` route depends on `Viewer` (read) or `Acting` (decide). The tenant of every request
comes from the token and nowhere else: no route takes a tenant from the body, the query or the
path, so a token of tenant A cannot even name tenant B. A missing, unknown, expired or revoked
token is 401 (with `WWW-Authenticate: Bearer`); a valid token whose role is too small is 403.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from toolledger.api.errors import OperatorError
from toolledger.api.service import Operator, OperatorService
from toolledger.api.tokens import Role, TokenRecord, TokenRejected, TokenStore, role_allows
from toolledger.wiring.stack import LedgerStack

_bearer = HTTPBearer(
    auto_error=False,
    description="A token from `toolledger tokens create`; it carries the tenant and the role.",
)


class ApiError(OperatorError):
    """An HTTP error with the API's error body: one of the operator errors, with the status
    (and headers) the request itself earned (no token, the wrong role, still starting)."""

    code = "api_error"

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(code, message)
        self.status = status
        self.headers = dict(headers or {})


@dataclass
class ApiContext:
    """What the routes of one app use; built at creation or by the app's startup."""

    service: OperatorService
    tokens: TokenStore
    stack: LedgerStack | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


def api_context(request: Request) -> ApiContext:
    context: ApiContext | None = getattr(request.app.state, "toolledger", None)
    if context is None:
        raise ApiError(503, "starting", "the API is still connecting to the ledger; retry shortly")
    return context


Context = Annotated[ApiContext, Depends(api_context)]
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _requires(needed: Role) -> Callable[[ApiContext, _Credentials], Awaitable[TokenRecord]]:
    async def authenticate(context: Context, credentials: _Credentials) -> TokenRecord:
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise ApiError(
                401,
                "missing_token",
                "send `Authorization: Bearer <token>`; an admin creates tokens with "
                "`toolledger tokens create --tenant ... --operator ... --role ...`",
                challenge,
            )
        try:
            token = await context.tokens.authenticate(credentials.credentials)
        except TokenRejected as exc:
            raise ApiError(401, exc.code, exc.message, challenge) from None
        return check_role(token, needed)

    return authenticate


def check_role(token: TokenRecord, needed: Role) -> TokenRecord:
    """`token` if its role may do what `needed` may; 403 otherwise (the API and the console)."""
    if not role_allows(token.role, needed):
        raise ApiError(
            403,
            "forbidden",
            f"token {token.token_id} ({token.operator}) has role {token.role}; this needs "
            f"role {needed} or higher",
        )
    return token


def operator_of(token: TokenRecord) -> Operator:
    """The acting operator: the token's tenant and operator id, never the request's."""
    return Operator(tenant_id=token.tenant_id, operator=token.operator)


Viewer = Annotated[TokenRecord, Depends(_requires("viewer"))]
Acting = Annotated[TokenRecord, Depends(_requires("operator"))]
