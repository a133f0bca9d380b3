"""The operator console: server-rendered pages over the same service as the JSON API.

`toolledger api` serves it under `/console` (docs/console.md). Operators who settle unknown
calls are not always programmers, so the console shows the queue of calls that need a person
and a detail page with forms, where the API has curl. It is plain HTML from Jinja2 templates
and one stylesheet: no JavaScript, no build step, nothing fetched from elsewhere.

It adds no rule of its own. A page reads, and a form decides, through
`toolledger.api.service.OperatorService` with the signed-in token's tenant and operator id, so
tenancy, roles, the required reason, `expected_version` and the 409 of a lost race are the
JSON API's, enforced once. What the console adds is how a browser signs in safely: a bearer
token pasted once, a server-side session behind an HttpOnly, SameSite=Strict cookie, and a
CSRF token in every form (`toolledger.api.console.sessions`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from toolledger.api.console import actions, pages
from toolledger.api.console.sessions import Sessions
from toolledger.api.console.web import (
    HERE,
    PREFIX,
    ConsolePageError,
    SignInRequired,
    error_page,
    to_sign_in,
)

__all__ = ["Sessions", "mount_console"]


def mount_console(app: FastAPI, sessions: Sessions | None = None) -> None:
    """Serve the console under `/console` on `app`, with `sessions` (default: a new store)."""
    app.state.console_sessions = sessions if sessions is not None else Sessions()
    app.include_router(pages.router)
    app.include_router(actions.router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="console-static")

    @app.exception_handler(SignInRequired)
    async def sign_in_required(request: Request, exc: SignInRequired) -> Response:
        if request.method == "GET":
            return to_sign_in(exc.why)
        return error_page(
            request,
            401,
            "Sign in again",
            "Your console session ended before this form was sent, so nothing was changed. "
            f"Sign in at {PREFIX}/signin and submit it again.",
        )

    @app.exception_handler(ConsolePageError)
    async def refused(request: Request, exc: ConsolePageError) -> Response:
        return error_page(request, exc.status, exc.title, exc.message)
