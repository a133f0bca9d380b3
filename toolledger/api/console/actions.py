"""The console's forms: sign in, sign out, and the four decisions an operator makes.

Every POST checks the form's CSRF token against the session first (403 with a message, and
nothing changes, when it is missing or wrong), then the role with the JSON API's own check
(`check_role`: a viewer is refused with 403 even though the page showed no button), then calls
`OperatorService`, which applies every ledger rule: the tenant from the token, the reason
required, `expected_version` (the version the operator saw on the page, carried in the form),
and the decider's compare-and-set. The answer page shows the new record, or, when the ledger
refused (409), the record as it is now: who settled it, when, with which reason, and why this
decision lost. A form the ledger refuses as given (a blank or whitespace-only reason, a value
that is not JSON) comes back on the call's page with the message beside it and what was typed
kept (422), not as a page of its own that loses it.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from toolledger.api.auth import ApiError, api_context
from toolledger.api.console.pages import FormAgain, detail_page
from toolledger.api.console.sessions import COOKIE
from toolledger.api.console.web import (
    PREFIX,
    ConsolePageError,
    Signed,
    api_error_page,
    call_url,
    form_of,
    render,
    sessions_of,
    set_session_cookie,
    signed_in,
    to_sign_in,
)
from toolledger.api.errors import Conflict, InvalidRequest, OperatorError, http_status
from toolledger.api.service import Compensation
from toolledger.api.tokens import TokenRejected, hash_token
from toolledger.events.records import CallRecord

router = APIRouter(prefix=PREFIX, include_in_schema=False)

Decision = Literal["resolve", "approve", "reject", "compensate"]
DECISIONS: tuple[Decision, ...] = get_args(Decision)


@router.post("/signin")
async def sign_in(request: Request) -> Response:
    """Check the pasted token; on success start a new signed-in session (a new id)."""
    sessions = sessions_of(request)
    session = sessions.get(request.cookies.get(COOKIE))
    if session is None:
        return to_sign_in("expired")
    fields = await form_of(request, session)
    token = fields.get("token", "").strip()
    try:
        await api_context(request).tokens.authenticate(token)
    except TokenRejected as exc:
        return render(
            request, "signin.html", 401, csrf=session.csrf, message=None, error=exc.message
        )
    sessions.end(session.session_id)
    signed = sessions.new(token_digest=hash_token(token))
    response = RedirectResponse(f"{PREFIX}/queue", status_code=303)
    set_session_cookie(response, request, signed)
    return response


@router.post("/signout")
async def sign_out(request: Request) -> Response:
    signed = await signed_in(request)
    await form_of(request, signed.session)
    sessions_of(request).end(signed.session.session_id)
    response = to_sign_in("signed_out")
    response.delete_cookie(COOKIE, path=PREFIX)
    return response


@router.post("/call/{decision}")
async def apply_decision(request: Request, decision: str) -> Response:
    """One of the four decisions on the call named by the form's `key` field."""
    signed = await signed_in(request)
    fields = await form_of(request, signed.session)
    if decision not in DECISIONS:
        raise ConsolePageError(404, "No such action", f"the console has no action {decision!r}")
    try:
        signed.require_operator()
    except ApiError as exc:
        return api_error_page(request, exc, signed)
    key = fields.get("key", "")
    try:
        outcome = await _apply(request, signed, decision, key, fields)
    except InvalidRequest as exc:
        # The form as given cannot be applied: the same page again, the message beside the
        # form and what was typed still in it (the JSON API answers the same error with 422).
        again = FormAgain(decision, fields, exc.message)
        return await detail_page(request, signed, key, http_status(exc), again)
    except Conflict as exc:
        return render(
            request,
            "outcome.html",
            409,
            signed,
            title=f"Not applied · {key}",
            decision=decision,
            key=key,
            record=exc.record,
            conflict=exc,
            compensation=None,
        )
    except OperatorError as exc:
        return render(
            request,
            "error.html",
            http_status(exc),
            signed,
            title="Not applied",
            message=exc.message,
            back=call_url(key) if key else None,
        )
    record, compensation = outcome
    return render(
        request,
        "outcome.html",
        signed=signed,
        title=f"Applied · {key}",
        decision=decision,
        key=key,
        record=record,
        conflict=None,
        compensation=compensation,
    )


async def _apply(
    request: Request, signed: Signed, decision: str, key: str, fields: dict[str, str]
) -> tuple[CallRecord, CallRecord | None]:
    service = api_context(request).service
    reason = fields.get("reason", "")
    expected = _version(fields.get("expected_version", ""))
    match decision:
        case "resolve":
            outcome = fields.get("outcome", "")
            if outcome not in ("completed", "failed"):
                raise InvalidRequest(
                    "invalid_outcome", "choose an outcome: completed (it happened) or failed"
                )
            record: CallRecord = await service.resolve(
                signed.who,
                key,
                outcome="completed" if outcome == "completed" else "failed",
                reason=reason,
                value=_value(fields.get("value", "")),
                result_reference=fields.get("result_reference", "").strip() or None,
                expected_version=expected,
            )
            return record, None
        case "approve" | "reject":
            return await service.decide_approval(
                decision, signed.who, key, reason=reason, expected_version=expected
            ), None
        case _:
            done: Compensation = await service.compensate(signed.who, key, reason=reason)
            return done.record, done.compensation


def _version(text: str) -> int | None:
    """The record version the page showed; a form that lost it decides on the current one."""
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        raise InvalidRequest("invalid_version", f"expected_version must be a number, not {text!r}")
    return int(text)


def _value(text: str) -> Any:
    """The optional result of a completed resolution, typed as JSON (blank: none)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(
            "invalid_value",
            f'the value must be JSON (e.g. {{"credit_id": "cr_81"}} or "cr_81"): {exc}',
        ) from None
