"""`create_app`: the operator HTTP API as a FastAPI application.

The app is built over one of three things: a `LedgerStack` the caller owns (tests, embedding),
an `OperatorService` (the same service the CLI uses), or an async factory of a stack that the
app opens at startup and closes at shutdown (`toolledger api`, where the stack must live in the
server's event loop). Tokens default to the ledger's own store: PostgreSQL's `api_tokens` for a
PostgreSQL ledger, memory for the embedded one.

Besides `/v1/tool-executions` (`toolledger.api.routes`) it serves:

- `/console`: the operator console, HTML pages over the same service (`toolledger.api.console`);
- `/healthz`: the process is up;
- `/readyz`: PostgreSQL answers, a projector has bound the events topic, every partition's
  owner is renewing its lease (`toolledger.projections.leases`), and this process's operator
  commands are getting verdicts (none is stuck, the last one did not time out);
- `/metrics`: the default Prometheus registry (`toolledger.api.metrics`), with the ledger-wide
  gauges refreshed at most every few seconds so a scrape never scans the ledger twice. Its
  counts span every tenant, so it answers only to `Authorization: Bearer
  <TOOLLEDGER_METRICS_TOKEN>` (a scrape token, not a tenant's), and is not served without one.
- `/readyz` also checks that this API can sign: its key id is registered by the ledger's
  projectors with the same public key (docs/security.md).

Requests whose body exceeds `max_body_bytes` are refused with 413 before any route runs, and
every error, whoever raises it, has the one body shape of `toolledger.api.schemas.ErrorResponse`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolledger.api import metrics
from toolledger.api.auth import ApiContext, ApiError, api_context
from toolledger.api.closing import close_stack
from toolledger.api.compensation import RuntimeCompensator
from toolledger.api.console import Sessions, mount_console
from toolledger.api.errors import Conflict, NotFound, OperatorError, http_status
from toolledger.api.routes import STATUSES, errors, router
from toolledger.api.runs import router as runs_router
from toolledger.api.schemas import ErrorDetail, ErrorResponse, Health, ToolExecution
from toolledger.api.service import OperatorService
from toolledger.api.tokens import MemoryTokens, PostgresTokens, TokenStore
from toolledger.errors import ConfigError
from toolledger.events.models import utcnow
from toolledger.projections.fresh import FreshReads, LedgerReads
from toolledger.projections.health import ProjectorHealth, lag_checks, update_lease_gauges
from toolledger.projections.health import problems as projector_problems
from toolledger.projections.leases import PartitionLease, lease_checks, lease_problems
from toolledger.projections.postgres import PostgresLedger
from toolledger.runtime.tools import Tool
from toolledger.settings import OperatorSettings
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort

__all__ = ["close_stack", "create_app"]

StackFactory = Callable[[], Awaitable[LedgerStack]]

MAX_BODY_BYTES = 64 * 1024
#: The shortest time between two refreshes of the ledger-wide gauges.
METRICS_REFRESH_S = 5.0
#: How long /readyz waits for PostgreSQL before calling the API not ready.
READY_TIMEOUT_S = 2.0


def create_app(
    source: LedgerStack | OperatorService | StackFactory,
    settings: OperatorSettings,
    *,
    tokens: TokenStore | None = None,
    tools: Mapping[str, Tool[Any, Any]] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    console_sessions: Sessions | None = None,
    health: ProjectorHealth | None = None,
) -> FastAPI:
    """The operator API over `source` (see the module docstring), configured by `settings`.

    `tools` (tool name -> `Tool`) lets the API run compensations; without it, compensating is
    refused with 409 saying so. `console_sessions` is the console's session store (default: a
    new in-memory one). `health` is the in-process projector's (`toolledger server`): its
    halted partitions and lag show in `/readyz`, `/metrics` and the console's banner. Raises
    `ConfigError` when no signing key is configured.
    """
    if not isinstance(source, OperatorService):
        settings.require_signing_key()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if callable(source) and not isinstance(source, LedgerStack | OperatorService):
            stack = await source()
            try:
                app.state.toolledger = _context(stack, settings, tokens, tools)
            except BaseException:
                await close_stack(stack)
                raise
            app.state.toolledger.closers.append(lambda: close_stack(stack))
        try:
            yield
        finally:
            context: ApiContext | None = getattr(app.state, "toolledger", None)
            if context is not None:
                for close in context.closers:
                    await close()

    app = FastAPI(
        title="toolledger operator API",
        version="1",
        summary="Settle the tool calls nobody can know automatically: resolve, approve, "
        "reject, compensate.",
        lifespan=lifespan,
    )
    if isinstance(source, LedgerStack | OperatorService):
        app.state.toolledger = _context(source, settings, tokens, tools)
    app.include_router(router)
    app.include_router(runs_router)
    mount_console(app, console_sessions)
    if health is None and isinstance(source, LedgerStack) and source.projector is not None:
        health = ProjectorHealth(source.projector, source.events)
    app.state.projector_health = health
    _health_routes(app, settings)
    _error_handlers(app)
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)
    return app


def _context(
    source: LedgerStack | OperatorService,
    settings: OperatorSettings,
    tokens: TokenStore | None,
    tools: Mapping[str, Tool[Any, Any]] | None,
) -> ApiContext:
    compensator = None
    if isinstance(source, OperatorService):
        service, stack = source, None
    else:
        stack = source
        if tools:
            compensator = RuntimeCompensator(
                StackPort(stack), tools, verdict_timeout=settings.verdict_timeout_s
            )
        service = OperatorService(
            stack.reads,
            stack.commands,
            signing_keys=settings.signing_keys,
            verdict_timeout=settings.verdict_timeout_s,
            compensator=compensator,
        )
    context = ApiContext(service=service, tokens=tokens or MemoryTokens(), stack=stack)
    if compensator is not None:  # before the stack closes: its last appends need the stack
        context.closers.append(compensator.close)
    if tokens is None:
        context.tokens = _default_tokens(service.store, settings)
        context.closers.append(context.tokens.close)
    return context


def _default_tokens(reads: LedgerReads, settings: OperatorSettings) -> TokenStore:
    store = reads.store if isinstance(reads, FreshReads) else reads
    if isinstance(store, PostgresLedger):
        if not settings.database_url:
            raise ConfigError("TOOLLEDGER_DATABASE_URL must be set: API tokens live in PostgreSQL")
        return PostgresTokens(settings.database_url, store.schema, create=False)
    return MemoryTokens()


def _health_routes(app: FastAPI, settings: OperatorSettings) -> None:
    refreshed = {"at": -METRICS_REFRESH_S}

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        """The process is up (it says nothing about Kafka or PostgreSQL)."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["health"], responses=errors(503))
    async def readyz(request: Request) -> Health:
        """Ready to take operator commands: PostgreSQL answers, a projector has bound the
        events topic, every partition's owner renews its lease, and this process's commands
        are getting verdicts."""
        context = api_context(request)
        service = context.service
        problems: list[str] = []
        leases: list[PartitionLease] = []
        try:
            bound = await asyncio.wait_for(service.store.partition_state(0), READY_TIMEOUT_S)
            signing = await asyncio.wait_for(service.signing_problem(), READY_TIMEOUT_S)
            leases = await asyncio.wait_for(service.store.partition_leases(), READY_TIMEOUT_S)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            problems.append(f"the ledger store does not answer ({exc or 'timeout'})")
        else:
            if bound is None:
                problems.append(
                    "no projector has bound the events topic yet: start `toolledger projector`"
                )
            if signing is not None:
                problems.append(f"this API cannot sign: {signing}")
        if service.verdicts_stalled():
            problems.append("the last operator command got no verdict in time")
        lag = service.verdict_lag()
        if lag > service.verdict_timeout / 2:
            problems.append(f"an operator command has waited {lag:.1f}s for its verdict")
        stack = context.stack
        health: ProjectorHealth | None = request.app.state.projector_health
        checks = {"ledger": "ok", "verdicts": "ok"}
        if stack is not None and stack.projector is not None and stack.projector_task.done():
            problems.append("this process's projector stopped")
        if health is not None:
            problems.extend(projector_problems(health.projector))
            checks.update(lag_checks(health))
        problems.extend(lease_problems(leases))
        checks.update(lease_checks(leases))
        if problems:
            raise ApiError(503, "not_ready", "; ".join(problems))
        return Health(status="ready", checks=checks)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        """Prometheus exposition of the default registry (text format), to the scrape token."""
        _check_metrics_token(request, settings)
        service = api_context(request).service
        if time.monotonic() - refreshed["at"] >= METRICS_REFRESH_S:
            stats = await service.store.call_stats(utcnow(), metrics.UNSETTLED_AGES)
            for status in STATUSES:
                metrics.CALLS.labels(status).set(stats.by_status.get(status, 0))
            for (unsettled, bound), count in stats.unsettled.items():
                metrics.UNSETTLED.labels(unsettled, f"{bound:g}").set(count)
            metrics.RESUME_FAILED.set(stats.resume_failed)
            refreshed["at"] = time.monotonic()
        metrics.PROJECTOR_LAG.set(service.verdict_lag())
        update_lease_gauges(await service.store.partition_leases())
        health: ProjectorHealth | None = request.app.state.projector_health
        if health is not None:
            health.update_gauges()
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _check_metrics_token(request: Request, settings: OperatorSettings) -> None:
    """Metrics count calls of every tenant: only the scraper holding the ledger-wide
    `TOOLLEDGER_METRICS_TOKEN` may read them (a tenant's API token is not enough)."""
    if settings.metrics_token is None:
        raise ApiError(
            404,
            "metrics_disabled",
            "/metrics is not served: set TOOLLEDGER_METRICS_TOKEN and scrape with "
            "`Authorization: Bearer <token>`",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    expected = settings.metrics_token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise ApiError(
            401,
            "unauthorized",
            "/metrics needs `Authorization: Bearer <TOOLLEDGER_METRICS_TOKEN>`",
            {"WWW-Authenticate": "Bearer"},
        )


def _error(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    conflict: Conflict | None = None,
) -> JSONResponse:
    detail = ErrorDetail(code=code, message=message)
    if conflict is not None:
        detail = ErrorDetail(
            code=code,
            message=message,
            record=None if conflict.record is None else ToolExecution.of(conflict.record),
            resolvable_after=conflict.resolvable_after,
        )
    body = ErrorResponse(error=detail).model_dump(mode="json")
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(OperatorError)
    async def operator_error(_request: Request, exc: OperatorError) -> JSONResponse:
        status = http_status(exc)
        conflict = exc if isinstance(exc, Conflict) else None
        said = exc.message
        if isinstance(exc, NotFound):
            said += "; list them with GET /v1/tool-executions"
        return _error(status, exc.code, said, conflict=conflict)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or 'request'}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(422, "invalid_request", problems or "the request is malformed")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode: one more malformed request (422).
            return _error(422, "invalid_request", f"body: {exc.detail} (send UTF-8 JSON)")
        codes = {404: "not_found", 405: "method_not_allowed"}
        message = str(exc.detail)
        if exc.status_code == 404:
            message = "no such endpoint; the API's endpoints are listed at /openapi.json"
        code = codes.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, message, exc.headers)

    @app.exception_handler(asyncpg.PostgresError)
    @app.exception_handler(asyncpg.InterfaceError)
    @app.exception_handler(OSError)
    async def store_down(_request: Request, exc: Exception) -> JSONResponse:
        return _error(
            503,
            "ledger_unavailable",
            f"the ledger store cannot be read ({type(exc).__name__}: {exc}); retry once "
            "PostgreSQL is reachable",
        )


class _BodyLimit:
    """Refuses request bodies over `max_bytes` with 413, before the route reads them.

    The body is read here (at most `max_bytes` + one chunk) and replayed to the app, so a body
    without a Content-Length (chunked) is limited as surely as one that declares its size.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; let the app see it
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            return replayed.pop() if replayed else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        response = _error(
            413,
            "body_too_large",
            f"the request body is larger than {self.max_bytes} bytes; operator requests are "
            "small JSON documents (a reason, an outcome, a value)",
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": response.raw_headers,
            }
        )
        await send({"type": "http.response.body", "body": response.body})
