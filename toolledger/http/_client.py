"""`ToolHTTP`: one request of a tool, keyed, bounded by its sending boundary, and classified.

The boundary is found on the wire, not guessed: httpcore (under httpx's default transport)
reports each stage of a request to the request's `trace` extension, and the stage
`send_request_headers` is the first at which any byte of the request leaves the process.
Everything before it (waiting for a pooled connection, DNS, TCP connect, TLS) can fail without
the server having seen anything. The hook calls `ToolContext.mark_sending()` right then.

A transport that reports no stages (a custom or mock transport) gives no such mark, so the
helper assumes the worst: a request that ends in anything but an error that by its type can only
come before sending (`httpx.ConnectError`, `ConnectTimeout`, `PoolTimeout`,
`UnsupportedProtocol`) counts as sent. An answer always counts as sent, whatever the transport.

The client is the user's own `httpx.AsyncClient` if given (its base URL, auth, transport and
timeouts stay), else one made here on httpx's default transport and closed by `aclose()`. Only
the latter is known to report every stage, so only there does a request cancelled before any
stage (the tool's timeout while waiting for a pooled connection) count as not sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import httpx

from toolledger.http._errors import (
    RequestFailed,
    RequestInProgress,
    RequestLabel,
    RequestNotSent,
    RequestOutcomeUnknown,
    RequestRefused,
)
from toolledger.runtime.context import ToolContext
from toolledger.runtime.tools import SENDS_WITH_KEY

#: What an answer's status means for the call (see the table in `toolledger.http`).
Outcome = Literal["result", "failed", "refused", "in_progress", "indeterminate"]

DEFAULT_KEY_HEADER = "Idempotency-Key"
#: The header a Stripe-style server sets on an answer it replays for a repeated key (evidence).
DEFAULT_REPLAYED_HEADER = "Idempotent-Replayed"
#: Statuses a server sends before it looks at the request (credentials, proxies, timeouts,
#: rate limits): failed, and no evidence about an earlier request with the same key.
DEFAULT_STATUSES: Mapping[int, Outcome] = {
    401: "refused",
    403: "refused",
    407: "refused",
    408: "refused",
    429: "refused",
}
#: Characters of a failed answer's body kept in the error (and so in the ledger).
BODY_LIMIT = 500

#: Errors that, by their type, can only happen before a request's first byte is written.
_NEVER_SENT: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)
_SENDING_STAGE = ".send_request_headers.started"

F = TypeVar("F", bound=Callable[..., Awaitable[httpx.Response]])


def sends_with_key(method: F) -> F:
    """Mark `method` as passing the key and marking sending for the context it is handed, so
    the tool declaration and `assert_tool_contract` see it (`toolledger.runtime.tools`)."""
    setattr(method, SENDS_WITH_KEY, True)
    return method


def outcome_of(status: int, statuses: Mapping[int, Outcome]) -> Outcome:
    """What an answer with `status` means: the tool's own table first, then by class."""
    mapped = statuses.get(status)
    if mapped is not None:
        return mapped
    if 200 <= status < 300:
        return "result"
    if 400 <= status < 500:
        return "failed"
    return "indeterminate"  # 5xx, and a 1xx/3xx the tool did not map


class _Wire:
    """The request's `trace` extension: marks sending at the first byte, chains the user's.

    Once the mark is made nothing more is needed from the stages, so the hook takes itself out
    of the request's extensions (the dict httpcore reads each stage's hook from), unless it
    chains a hook of the user's: httpcore then calls nothing for the remaining stages, which
    halves what the helper costs a request.
    """

    __slots__ = ("context", "extensions", "inner", "seen", "sent")

    def __init__(self, context: ToolContext, extensions: dict[str, Any]) -> None:
        self.context = context
        self.inner = extensions.get("trace")
        self.extensions = extensions
        extensions["trace"] = self
        self.seen = False
        self.sent = False

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.seen = True
        if not self.sent and name.endswith(_SENDING_STAGE):
            self.sent = True
            self.context.mark_sending()
            if self.inner is None:
                del self.extensions["trace"]
        if self.inner is not None:
            await self.inner(name, info)


class ToolHTTP:
    """HTTP requests for tools: `await payments.post("/v1/refunds", json=..., context=context)`.

    - sets `key_header` (`Idempotency-Key`) to `context.idempotency_key`;
    - marks the call's sending boundary when the request starts to leave;
    - returns the response of a `result` status, raises the error of every other outcome
      (`toolledger.http._errors`). `statuses` maps single statuses to outcomes on top of
      `DEFAULT_STATUSES`, e.g. `{409: "in_progress"}` for a server that answers 409 while a
      request with the same key is still being processed.

    Make one per downstream at module level, before the tools that use it: the tool declaration
    finds it by name to know that the tool passes its key (`toolledger.runtime.tools`).
    """

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        *,
        base_url: str = "",
        timeout: float | httpx.Timeout = 10.0,
        limits: httpx.Limits | None = None,
        key_header: str = DEFAULT_KEY_HEADER,
        statuses: Mapping[int, Outcome] | None = None,
        replayed_header: str = DEFAULT_REPLAYED_HEADER,
        body_limit: int = BODY_LIMIT,
    ) -> None:
        if client is not None and base_url:
            raise ValueError("give the base_url to your own httpx.AsyncClient, not to ToolHTTP")
        self._owned = client is None
        if client is None:
            client = (
                httpx.AsyncClient(base_url=base_url, timeout=timeout)
                if limits is None  # httpx's default limits
                else httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits)
            )
        self.client = client
        self.key_header = key_header
        self.statuses: dict[int, Outcome] = {**DEFAULT_STATUSES, **(statuses or {})}
        self.replayed_header = replayed_header
        self.body_limit = body_limit

    async def aclose(self) -> None:
        """Close the client if it was made here (the user's own stays theirs to close)."""
        if self._owned:
            await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @sends_with_key
    async def request(
        self, method: str, url: str, *, context: ToolContext, **options: Any
    ) -> httpx.Response:
        """Send one request for the call `context` runs; `options` go to httpx's
        `build_request` (`json`, `params`, `headers`, `content`, `timeout`, `extensions`)."""
        request = self.client.build_request(method, url, **options)
        key = context.idempotency_key
        given = request.headers.get(self.key_header)
        label = RequestLabel(request.method, _shown(request.url), key)
        if given is not None and given != key:
            raise ValueError(
                f"{label} already carries {self.key_header}: {given}, another key than the "
                "call's; leave the header to toolledger.http"
            )
        request.headers[self.key_header] = key
        request.extensions = dict(request.extensions)  # httpcore reads this same dict
        wire = _Wire(context, request.extensions)
        try:
            response = await self.client.send(request)
        except httpx.HTTPError as exc:
            if not wire.sent and (wire.seen or isinstance(exc, _NEVER_SENT)):
                raise RequestNotSent(label, _cause(exc)) from exc
            context.mark_sending()
            raise RequestOutcomeUnknown(label, f"then {_cause(exc)}") from exc
        except BaseException:
            # Cancelled (the tool's timeout) before any stage was reported: still waiting for
            # a pooled connection if the transport is httpx's own (which reports every stage);
            # anywhere, for all we know, in a transport of the user's.
            if not wire.seen and not self._owned:
                context.mark_sending()
            raise
        context.mark_sending()
        return self._answer(label, response, context)

    def _answer(
        self, label: RequestLabel, response: httpx.Response, context: ToolContext
    ) -> httpx.Response:
        status = response.status_code
        replayed = response.headers.get(self.replayed_header)
        context.evidence.append(
            f"{label.method} {label.url} -> {status}"
            + (f" ({self.replayed_header}: {replayed})" if replayed else "")
        )
        outcome = outcome_of(status, self.statuses)
        if outcome == "result":
            return response
        body = _bounded(response.text, self.body_limit)
        if outcome == "failed":
            raise RequestFailed(label, status, body)
        if outcome == "refused":
            raise RequestRefused(label, status, body)
        if outcome == "in_progress":
            raise RequestInProgress(label, status, body)
        raise RequestOutcomeUnknown(
            label, f"the server answered {status}: {body or 'no body'}", status=status
        )

    @sends_with_key
    async def get(self, url: str, *, context: ToolContext, **options: Any) -> httpx.Response:
        """`request("GET", ...)`."""
        return await self.request("GET", url, context=context, **options)

    @sends_with_key
    async def post(self, url: str, *, context: ToolContext, **options: Any) -> httpx.Response:
        """`request("POST", ...)`."""
        return await self.request("POST", url, context=context, **options)

    @sends_with_key
    async def put(self, url: str, *, context: ToolContext, **options: Any) -> httpx.Response:
        """`request("PUT", ...)`."""
        return await self.request("PUT", url, context=context, **options)

    @sends_with_key
    async def patch(self, url: str, *, context: ToolContext, **options: Any) -> httpx.Response:
        """`request("PATCH", ...)`."""
        return await self.request("PATCH", url, context=context, **options)

    @sends_with_key
    async def delete(self, url: str, *, context: ToolContext, **options: Any) -> httpx.Response:
        """`request("DELETE", ...)`."""
        return await self.request("DELETE", url, context=context, **options)


def _shown(url: httpx.URL) -> str:
    """The URL as messages show it: no query string, no credentials. Built from its parts,
    because `URL.copy_with` parses the URL again (a fifth of the helper's cost per request)."""
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


def _cause(exc: httpx.HTTPError) -> str:
    text = str(exc) or "no detail"
    return f"{type(exc).__name__} ({text})"


def _bounded(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more)"
