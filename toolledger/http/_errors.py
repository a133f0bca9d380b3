"""What an HTTP request of a tool ended as, as errors the runtime already knows how to record.

Each class maps onto one row of the outcome table (`toolledger.http`), through the bases the
executor classifies by (`toolledger.runtime.executor`):

- `RequestNotSent`: nothing left. A plain error raised before the request's sending boundary,
  so a write is `failed`, not attempted, and a read is tried again.
- `RequestOutcomeUnknown` (and `RequestInProgress`): the request left and no usable answer came
  back. Raised after the boundary, so a write is `indeterminate` and a read is tried again.
- `RequestFailed`: the server answered no (a 4xx). A `ToolFailedError`: `failed`, no effect.
- `RequestRefused`: the server refused before looking at the request (401, 403, 407, 408,
  429 by default). `failed` too, and a `RefusedBeforeLookup`, so a resend that meets it learns
  nothing about the first request (`toolledger.runtime.resend`).

Every message names the request (method, URL without its query, the idempotency key), what
happened, and what to do next; `status` and a bounded `body` are kept for code.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolledger.errors import ToolLedgerError
from toolledger.runtime.errors import ToolFailedError, resolve_command
from toolledger.runtime.resend import RefusedBeforeLookup


@dataclass(frozen=True)
class RequestLabel:
    """How messages name one request: never its query string or headers (credentials)."""

    method: str
    url: str
    key: str

    def __str__(self) -> str:
        return f"{self.method} {self.url} (idempotency key {self.key})"


class RequestNotSent(ToolLedgerError):
    """The request never left: DNS, connect refused or timed out, TLS, pool timeout."""

    code = "http_request_not_sent"

    def __init__(self, request: RequestLabel, cause: str) -> None:
        super().__init__(
            f"{request} was not sent: {cause}. Nothing reached the server, so the call is "
            "failed, not attempted, and safe to run again with the same tool_call_id (a read "
            "is retried by itself)."
        )
        self.request = request


class RequestOutcomeUnknown(ToolLedgerError):
    """The request left and no usable answer came back: the server may have acted on it."""

    code = "http_outcome_unknown"

    def __init__(self, request: RequestLabel, what: str, *, status: int | None = None) -> None:
        super().__init__(
            f"{request} was sent and {what}: the server may have acted on it. It is not sent "
            "again by itself: a tool declared external(replays_key_for=...) is resent with the "
            "same key by the reconciler or on replay; otherwise look the key up and settle it "
            f"with {resolve_command(request.key)}."
        )
        self.request = request
        self.status = status


class RequestInProgress(RequestOutcomeUnknown):
    """The server says a request with this key is still being processed (a 409, if mapped)."""

    code = "http_request_in_progress"

    def __init__(self, request: RequestLabel, status: int, body: str) -> None:
        RequestOutcomeUnknown.__init__(
            self,
            request,
            f"the server answered {status}: a request with this key is still in progress "
            f"there ({body or 'no body'}); its outcome is the first request's, not known yet",
            status=status,
        )
        self.body = body


class RequestFailed(ToolFailedError):
    """The server answered no (a 4xx): the request had no effect."""

    code = "http_request_failed"

    def __init__(self, request: RequestLabel, status: int, body: str) -> None:
        super().__init__(
            f"{request} was refused by the server with {status}: {body or 'no body'}. It had "
            "no effect; fix what the answer names before calling again with a new "
            "tool_call_id."
        )
        self.request = request
        self.status = status
        self.body = body


class RequestRefused(RequestFailed, RefusedBeforeLookup):
    """The server refused the request before looking at it (credentials, rate limits)."""

    code = "http_request_refused"
