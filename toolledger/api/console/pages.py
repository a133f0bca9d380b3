"""The console's pages: sign-in, the queue of calls that need a person, and a call's detail.

Each page reads through `OperatorService` with the signed-in token's tenant, so a page shows
exactly what `GET /v1/tool-executions` would: another tenant's key is "not found".

The queue (`/console/queue`) lists, longest-waiting first, what only an operator can move:
indeterminate calls, `started` calls past their deadline (plus the clock-skew grace, when an
operator may resolve them), calls awaiting approval, and contested calls where the ledger
records that flag. Filters narrow it by status, tool and run; pages follow the service's
cursor. The detail page (`/console/call?key=...`) shows the record, its arguments and result,
the full history with every verdict (rejected requests and late outcomes are marked as
evidence the ledger kept and ignored), whether the key's hash chain holds, and the run's state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from toolledger.api.auth import api_context
from toolledger.api.console.sessions import COOKIE
from toolledger.api.console.web import (
    PREFIX,
    SIGN_IN_REASONS,
    Signed,
    render,
    sessions_of,
    set_session_cookie,
    signed_in,
)
from toolledger.api.errors import NotFound, OperatorError, http_status
from toolledger.api.service import Page
from toolledger.events.fold import HistoryEntry, broken_chains
from toolledger.events.records import CallRecord, CallStatus

STATUSES: tuple[CallStatus, ...] = get_args(CallStatus)
#: What the queue shows by default: calls only an operator can move.
UNSETTLED: frozenset[CallStatus] = frozenset({"indeterminate", "started", "awaiting_approval"})
#: Filters beyond the plain statuses: contested calls are settled ones an operator must decide
#: again (any status; the store filters on the flag, so pages stay full).
VIEWS = ("unsettled", "overdue", "contested", *STATUSES)
PAGE_SIZE = 25

router = APIRouter(prefix=PREFIX, include_in_schema=False)


@router.get("")
async def home() -> RedirectResponse:
    """`/console` opens the queue (which sends a browser without a session to sign in)."""
    return RedirectResponse(f"{PREFIX}/queue", status_code=303)


@router.get("/signin")
async def sign_in_page(request: Request, why: str = "signin") -> Response:
    """The sign-in form. It opens an anonymous session so the form has a CSRF token too."""
    session = sessions_of(request).get(request.cookies.get(COOKIE))
    if session is not None and session.signed_in:
        return RedirectResponse(f"{PREFIX}/queue", status_code=303)
    if session is None:
        session = sessions_of(request).new()
    message = SIGN_IN_REASONS.get(why, SIGN_IN_REASONS["signin"])
    response = render(request, "signin.html", csrf=session.csrf, message=message, error=None)
    set_session_cookie(response, request, session)
    return response


@dataclass(frozen=True)
class Filters:
    """The queue's filters as the page's form holds them (empty text: no filter)."""

    view: str = "unsettled"
    tool: str = ""
    run: str = ""

    def query(self, cursor: str | None = None) -> dict[str, str]:
        """The query string that shows these filters (and the page at `cursor`)."""
        fields = {"status": self.view, "tool": self.tool, "run": self.run, "cursor": cursor or ""}
        return {k: v for k, v in fields.items() if v}


@router.get("/queue", response_class=HTMLResponse)
async def queue(
    request: Request,
    status: Annotated[str, Query(max_length=40)] = "unsettled",
    tool: Annotated[str, Query(max_length=500)] = "",
    run: Annotated[str, Query(max_length=500)] = "",
    cursor: Annotated[str, Query(max_length=2000)] = "",
) -> Response:
    signed = await signed_in(request)
    filters = Filters(view=status if status in VIEWS else "unsettled", tool=tool, run=run)
    service = api_context(request).service
    try:
        counts = await service.counts(signed.who)
        not_resumed = await service.paused_runs(signed.who, resume_failed=True)
        page = await _page(request, signed, filters, cursor or None)
        histories = await service.histories([c.key for c in page.items])
    except OperatorError as exc:
        return render(
            request,
            "error.html",
            http_status(exc),
            signed,
            title="The queue cannot be shown",
            message=exc.message,
        )
    return render(
        request,
        "queue.html",
        signed=signed,
        title="Queue · toolledger console",
        counts=counts,
        not_resumed=not_resumed,
        page=page,
        attempts={c.key: attempts(c, h) for c, h in zip(page.items, histories, strict=True)},
        filters=filters,
        views=VIEWS,
        first_page=not cursor,
    )


async def _page(request: Request, signed: Signed, filters: Filters, cursor: str | None) -> Page:
    service = api_context(request).service
    view = filters.view
    statuses: frozenset[CallStatus]
    if view in ("unsettled", "overdue"):
        statuses = UNSETTLED if view == "unsettled" else frozenset({"started"})
    elif view == "contested":
        statuses = frozenset()
    else:
        statuses = frozenset(s for s in STATUSES if s == view)
    page: Page = await service.list_calls(
        signed.who,
        statuses=statuses,
        tool=filters.tool or None,
        run_id=filters.run or None,
        limit=PAGE_SIZE,
        cursor=cursor,
        overdue_only=view in ("unsettled", "overdue"),
        contested=True if view == "contested" else None,
    )
    return page


_OUTCOMES = frozenset({"call_completed", "call_failed", "call_indeterminate"})


def attempts(record: CallRecord, history: list[HistoryEntry]) -> int:
    """How many times the tool itself ran for this key: the runtime outcomes the ledger
    accepted (a refusal before anything was sent is not an attempt), plus the run under way."""
    ran = 0
    for entry in history:
        if entry.accepted and entry.event_type in _OUTCOMES:
            event = _entry(entry).event
            ran += event.get("source", "runtime") == "runtime" and not event.get("not_attempted")
    return ran + (record.status == "started")


@dataclass(frozen=True)
class FormAgain:
    """A decision form the ledger refused as given (a blank reason, a value that is not JSON):
    shown again on the detail page with the message beside it and what was typed kept."""

    decision: str
    fields: dict[str, str]
    message: str

    def shows(self, *decisions: str) -> bool:
        return self.decision in decisions

    def typed(self, name: str) -> str:
        return self.fields.get(name, "")


@router.get("/call", response_class=HTMLResponse)
async def call_detail(request: Request, key: Annotated[str, Query(max_length=1000)]) -> Response:
    return await detail_page(request, await signed_in(request), key)


async def detail_page(
    request: Request, signed: Signed, key: str, status: int = 200, form: FormAgain | None = None
) -> Response:
    """The detail page of `key` (with `form`: a refused form shown again, inline)."""
    service = api_context(request).service
    try:
        record, history = await service.show(signed.who, key)
    except OperatorError as exc:
        title = "No such call" if isinstance(exc, NotFound) else "The call cannot be shown"
        return render(
            request, "error.html", http_status(exc), signed, title=title, message=exc.message
        )
    run = await service.run(signed.who, record.run_id)
    return render(
        request,
        "detail.html",
        status,
        signed=signed,
        title=f"{record.key} · toolledger console",
        record=record,
        history=[_entry(h) for h in history],
        chain=broken_chains(history),
        run=run,
        form=form,
    )


@dataclass(frozen=True)
class Entry:
    """One history entry as the detail page shows it."""

    entry: HistoryEntry
    event: dict[str, Any]

    @property
    def evidence(self) -> str | None:
        """Why a rejected request is shown but did not change the call (None if accepted)."""
        if self.entry.accepted:
            return None
        if self.entry.reason == "late_outcome":
            return "late outcome: kept as evidence, ignored"
        return "rejected: kept as evidence, did not change the call"


def _entry(entry: HistoryEntry) -> Entry:
    try:
        event = json.loads(entry.event_json)
    except ValueError:
        event = {}
    return Entry(entry=entry, event=event if isinstance(event, dict) else {})
