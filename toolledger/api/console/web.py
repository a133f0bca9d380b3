"""What every console page shares: templates, who is signed in, CSRF, and error pages.

The console holds no rule of its own about the ledger. Who may see what comes from the
signed-in token exactly as for `/v1` (`operator_of`, `check_role`); what a decision does, and
whether it is refused, comes from `OperatorService`. This module only turns those answers into
HTML: an `OperatorError` or an `ApiError` becomes an error page with the same status the JSON
API would answer (404, 409, 422, 403, 503), and a conflict shows the record that won.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import markupsafe
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from toolledger.api.auth import ApiError, api_context, check_role, operator_of
from toolledger.api.console.sessions import COOKIE, Session, Sessions
from toolledger.api.service import Operator, resolvable_after
from toolledger.api.tokens import TokenRecord, TokenRejected, role_allows
from toolledger.events.models import utcnow
from toolledger.events.records import CallRecord

PREFIX = "/console"
HERE = Path(__file__).parent

#: Why a browser was sent to the sign-in page; the page says it in words (never echoed input).
SIGN_IN_REASONS = {
    "signin": "Sign in with your API token to use the console.",
    "expired": "Your console session ended (idle too long, or older than its lifetime). "
    "Sign in again.",
    "signed_out": "You are signed out.",
    "token_expired": "Your token expired. Ask an admin for a new one, then sign in again.",
    "token_revoked": "Your token was revoked. Ask an admin for a new one, then sign in again.",
    "invalid_token": "Your token is no longer known to this ledger. Sign in with a valid one.",
}


class SignInRequired(Exception):
    """No live, signed-in session: the browser is sent to the sign-in page (`why` says why)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class ConsolePageError(Exception):
    """A request the console refuses with an HTML page (403 CSRF, 422 bad form, ...)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


@dataclass(frozen=True)
class Signed:
    """A signed-in request: its session and the token's current record."""

    session: Session
    token: TokenRecord

    @property
    def who(self) -> Operator:
        return operator_of(self.token)

    @property
    def may_act(self) -> bool:
        """Whether to show action controls (the service's callers re-check on every POST)."""
        return role_allows(self.token.role, "operator")

    def require_operator(self) -> None:
        """403 unless the token may decide: the same check and message as the JSON API."""
        check_role(self.token, "operator")


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.console_sessions
    return sessions


async def signed_in(request: Request) -> Signed:
    """The request's signed-in session, its token re-checked; `SignInRequired` otherwise."""
    sessions = sessions_of(request)
    cookie = request.cookies.get(COOKIE)
    session = sessions.get(cookie)
    if session is None or session.token_digest is None:
        raise SignInRequired("expired" if cookie else "signin")
    try:
        token = await api_context(request).tokens.authenticate_digest(session.token_digest)
    except TokenRejected as exc:
        sessions.end(session.session_id)
        raise SignInRequired(exc.code) from None
    return Signed(session=session, token=token)


async def form_of(request: Request, session: Session) -> dict[str, str]:
    """The posted form's text fields, after checking its CSRF token against the session."""
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    if not session.csrf_matches(fields.get("csrf_token")):
        raise ConsolePageError(
            403,
            "Refused: the form's CSRF token is missing or wrong",
            "Nothing was changed. Every console form carries a token tied to your session; "
            "this request did not. Reload the page and submit the form again.",
        )
    return fields


def set_session_cookie(response: Response, request: Request, session: Session) -> None:
    response.set_cookie(
        COOKIE,
        session.session_id,
        max_age=int(sessions_of(request).lifetime.total_seconds()),
        path=PREFIX,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def call_url(key: str) -> str:
    """The detail page of `key`: in a query parameter, percent-encoded, so `/`, `#`, `?` and
    `%` in a key survive every hop (a path segment would be split or decoded by proxies)."""
    return f"{PREFIX}/call?{urlencode({'key': key})}"


def dom_id(key: str) -> str:
    """An HTML id for `key` that needs no escaping in CSS selectors or URL fragments."""
    return "call-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def pretty(text: str | None) -> str:
    """Stored JSON shown indented (text that is not JSON as it is)."""
    if text is None:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except ValueError:
        return text


#: Where an identifier (a key, a tool, a run id) may wrap: after these, never inside a word.
_BREAKS = re.compile(r"(?<=[:/.])")


def ident(text: str) -> markupsafe.Markup:
    """`text` escaped, with a line-break opportunity (`<wbr>`) after each `:`, `/` and `.`, so
    a long key wraps between its parts and never inside one (the CSS keeps words whole)."""
    return markupsafe.Markup("<wbr>").join(_BREAKS.split(text))  # join escapes each part


#: Argument names that tell an operator most about a call's stakes: shown first.
_STAKES = re.compile(r"(^|_)(amount|total|price|sum|quantity)(_|$)", re.I)


def arguments_summary(arguments_json: str, limit: int = 80) -> str:
    """One line of a call's arguments for the queue, amounts first: `amount_cents=2500,
    account_id=a-7`. Nested values are shown as compact JSON; the line is cut at `limit`."""
    try:
        arguments = json.loads(arguments_json)
    except ValueError:
        arguments = arguments_json
    if isinstance(arguments, dict):
        order = list(arguments)
        names = sorted(order, key=lambda n: (_STAKES.search(n) is None, order.index(n)))
        line = ", ".join(f"{n}={_scalar(arguments[n])}" for n in names)
    else:
        line = _scalar(arguments)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def waited(since: datetime, now: datetime | None = None) -> str:
    """How long ago `since` was, the way a queue reads it: `3 d 4 h`, `2 h 5 min`, `12 s`."""
    seconds = max(0, int(((now or utcnow()) - since).total_seconds()))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {seconds} s"
    return f"{seconds} s"


def contested(record: CallRecord) -> bool:
    """The record's `contested` flag (a late completion disputes an operator's `failed`), for
    ledgers whose records carry it; False for those that do not."""
    return bool(getattr(record, "contested", False))


def resolvable_now(record: CallRecord, now: datetime | None = None) -> bool:
    """Whether an operator may resolve the call now, so the page offers the resolve form."""
    if record.status == "indeterminate" or contested(record):
        return True
    after = resolvable_after(record)
    return after is not None and (now or utcnow()) >= after


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(
    pretty=pretty, waited=waited, dom_id=dom_id, ident=ident, arguments=arguments_summary
)
_env.globals.update(
    call_url=call_url,
    contested=contested,
    resolvable_now=resolvable_now,
    resolvable_after=resolvable_after,
    prefix=PREFIX,
)
templates = Jinja2Templates(env=_env)


def render(
    request: Request, name: str, status: int = 200, signed: Signed | None = None, **context: Any
) -> HTMLResponse:
    """Render a page; `signed` adds the header's operator, role and sign-out form."""
    context.setdefault("title", "toolledger console")
    context.setdefault("back", None)
    # The server's projector, when this process runs one: halted partitions and lag on every page.
    health = getattr(request.app.state, "projector_health", None)
    context.setdefault("trouble", health.banner() if health is not None else [])
    context.setdefault("lag", health.lag() if health is not None else {})
    response = templates.TemplateResponse(
        request, name, {"signed": signed, **context}, status_code=status
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def error_page(
    request: Request, status: int, title: str, message: str, signed: Signed | None = None
) -> HTMLResponse:
    return render(request, "error.html", status, signed, title=title, message=message, back=None)


def to_sign_in(why: str) -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/signin?{urlencode({'why': why})}", status_code=303)


def api_error_page(request: Request, exc: ApiError, signed: Signed | None) -> HTMLResponse:
    titles = {403: "Not allowed", 503: "The ledger is not available"}
    return error_page(request, exc.status, titles.get(exc.status, "Refused"), exc.message, signed)
