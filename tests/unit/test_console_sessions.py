"""Console sessions and CSRF over the embedded ledger, through the app's real HTTP stack.

The browser tests (`tests/integration/test_console.py`) drive the flows in Chromium on Kafka
and PostgreSQL; here the session rules are checked cheaply and exactly, with a clock the test
moves: what the cookie carries, sign-in and its CSRF token, a new id at sign-in, sign-out,
idle and absolute expiry, a revoked token, the form errors, keys holding `/`, and the queue's
pages.
"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from tests import api_support as s
from toolledger.api import create_app
from toolledger.api.app import close_stack
from toolledger.api.console import Sessions
from toolledger.api.console.pages import PAGE_SIZE
from toolledger.api.console.sessions import ANONYMOUS_IDLE, COOKIE, MAX_SESSIONS
from toolledger.api.service import Operator, OperatorService
from toolledger.api.tokens import MemoryTokens, hash_token
from toolledger.events.models import utcnow
from toolledger.wiring.stack import LedgerStack


class Clock:
    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def stack() -> AsyncIterator[LedgerStack]:
    stack = await LedgerStack.memory(verify_keys=s.KEYS)
    try:
        yield stack
    finally:
        await close_stack(stack)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sessions(clock: Clock) -> Sessions:
    return Sessions(idle=timedelta(minutes=30), lifetime=timedelta(hours=8), clock=clock)


@pytest.fixture
def tokens() -> MemoryTokens:
    return MemoryTokens()


@pytest.fixture
def app(stack: LedgerStack, tokens: MemoryTokens, sessions: Sessions) -> FastAPI:
    return create_app(
        stack, s.api_settings(), tokens=tokens, tools=s.TOOLS, console_sessions=sessions
    )


@pytest.fixture
async def browser(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with s.client(app) as client:
        yield client


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def _sign_in(browser: httpx.AsyncClient, bearer: str) -> httpx.Response:
    page = await browser.get("/console/signin")
    return await browser.post(
        "/console/signin", data={"csrf_token": _csrf(page.text), "token": bearer}
    )


async def test_the_cookie_carries_only_a_session_id_httponly_and_samesite_strict(
    browser: httpx.AsyncClient, tokens: MemoryTokens, sessions: Sessions
) -> None:
    """The browser must hold nothing but a random id: not the token, not its hash."""
    bearer = await s.token(tokens)
    anonymous = (await browser.get("/console/signin")).cookies[COOKIE]
    signed = await _sign_in(browser, bearer)
    assert (signed.status_code, signed.headers["location"]) == (303, "/console/queue")
    cookie = signed.headers["set-cookie"]
    for flag in ("HttpOnly", "SameSite=strict", "Path=/console"):
        assert flag in cookie
    session_id = signed.cookies[COOKIE]
    assert session_id != anonymous, "signing in must issue a new session id"
    assert bearer not in cookie and hash_token(bearer) not in cookie
    session = sessions.get(session_id)
    assert session is not None and session.token_digest == hash_token(bearer)
    assert sessions.get(anonymous) is None
    assert (await browser.get("/console/queue")).status_code == 200


async def test_sign_in_refuses_a_missing_csrf_token_and_a_wrong_bearer(
    browser: httpx.AsyncClient, tokens: MemoryTokens
) -> None:
    bearer = await s.token(tokens)
    await browser.get("/console/signin")
    no_csrf = await browser.post("/console/signin", data={"token": bearer})
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
    wrong = await _sign_in(browser, "tlk_not-a-token")
    assert wrong.status_code == 401 and "not known to this ledger" in wrong.text
    assert (await browser.get("/console/queue")).status_code == 303


async def test_sign_out_ends_the_session_on_the_server(
    browser: httpx.AsyncClient, tokens: MemoryTokens, sessions: Sessions
) -> None:
    """A signed-out session id must not work again, even if a copy of the cookie is replayed."""
    await _sign_in(browser, await s.token(tokens))
    session_id = browser.cookies[COOKIE]
    queue = await browser.get("/console/queue")
    out = await browser.post("/console/signout", data={"csrf_token": _csrf(queue.text)})
    assert (out.status_code, out.headers["location"]) == (303, "/console/signin?why=signed_out")
    assert sessions.get(session_id) is None
    browser.cookies.set(COOKIE, session_id, path="/console")
    assert (await browser.get("/console/queue")).headers["location"].endswith("why=expired")


async def test_a_session_expires_when_idle_and_at_its_lifetime(
    browser: httpx.AsyncClient, tokens: MemoryTokens, clock: Clock
) -> None:
    bearer = await s.token(tokens, ttl=timedelta(days=2))
    await _sign_in(browser, bearer)
    clock.now += timedelta(minutes=29)
    assert (await browser.get("/console/queue")).status_code == 200
    clock.now += timedelta(minutes=31)
    idle = await browser.get("/console/queue")
    assert (idle.status_code, idle.headers["location"]) == (303, "/console/signin?why=expired")

    await _sign_in(browser, bearer)
    for _ in range(17):  # active all along, every 29 minutes: the lifetime still ends it
        clock.now += timedelta(minutes=29)
        answer = await browser.get("/console/queue")
    assert answer.status_code == 303 and answer.headers["location"].endswith("why=expired")
    signin = await browser.get(answer.headers["location"])
    assert "Your console session ended" in signin.text


async def test_revoking_the_token_ends_its_sessions_at_the_next_request(
    browser: httpx.AsyncClient, tokens: MemoryTokens
) -> None:
    """A revoked token must not keep working through a console session opened before."""
    issued = await tokens.create("acme", "alice", "operator", timedelta(hours=1))
    await _sign_in(browser, issued.token)
    assert (await browser.get("/console/queue")).status_code == 200
    await tokens.revoke(issued.record.token_id)
    answer = await browser.get("/console/queue")
    assert answer.headers["location"] == "/console/signin?why=token_revoked"
    assert "was revoked" in (await browser.get(answer.headers["location"])).text


async def test_a_key_with_a_slash_is_shown_and_resolved_through_its_query_parameter(
    browser: httpx.AsyncClient, tokens: MemoryTokens, stack: LedgerStack
) -> None:
    unknown = await s.Calls(stack).indeterminate("run-s", "tools/call#7?x=1&y=%2F")
    await _sign_in(browser, await s.token(tokens))
    queue = await browser.get("/console/queue")
    assert "/console/call?key=run-s%3Atools%2Fcall%237%3Fx%3D1%26y%3D%252F" in queue.text
    detail = await browser.get("/console/call", params={"key": unknown.key})
    assert detail.status_code == 200 and "Chain intact: 2 entries" in detail.text
    resolved = await browser.post(
        "/console/call/resolve",
        data={
            "csrf_token": _csrf(detail.text),
            "key": unknown.key,
            "expected_version": "2",
            "outcome": "completed",
            "value": '"cr_9"',
            "result_reference": "cr_9",
            "reason": "found cr_9",
        },
    )
    assert resolved.status_code == 200, resolved.text
    record = await stack.store.get_call(unknown.key)
    assert record is not None
    assert (record.status, record.result_json, record.result_reference) == (
        "completed",
        '"cr_9"',
        "cr_9",
    )


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        ({"outcome": "completed", "reason": "  "}, 422, "a decision needs a reason"),
        ({"outcome": "completed", "reason": "x", "value": "{oops"}, 422, "the value must be JSON"),
        ({"outcome": "maybe", "reason": "x"}, 422, "choose an outcome"),
        ({"outcome": "failed", "reason": "x", "value": '"cr_1"'}, 422, "a call resolved failed"),
        ({"outcome": "failed", "reason": "x", "expected_version": "two"}, 422, "a number"),
        ({"outcome": "failed", "reason": "x", "key": "run-x:nope"}, 404, "no tool execution"),
    ],
)
async def test_a_bad_form_is_refused_with_a_message_and_changes_nothing(
    browser: httpx.AsyncClient,
    tokens: MemoryTokens,
    stack: LedgerStack,
    fields: dict[str, str],
    status: int,
    message: str,
) -> None:
    unknown = await s.Calls(stack).indeterminate("run-f")
    await _sign_in(browser, await s.token(tokens))
    detail = await browser.get("/console/call", params={"key": unknown.key})
    form = {"csrf_token": _csrf(detail.text), "key": unknown.key, **fields}
    answer = await browser.post("/console/call/resolve", data=form)
    assert answer.status_code == status and message in answer.text
    record = await stack.store.get_call(unknown.key)
    assert record is not None and record.status == "indeterminate"


def test_sessions_that_never_sign_in_expire_sooner_and_their_number_is_capped(
    clock: Clock,
) -> None:
    """Opening the sign-in page in a loop must neither keep sessions forever nor grow the
    store without bound."""
    sessions = Sessions(clock=clock)
    anonymous = sessions.new()
    signed = sessions.new(token_digest="d" * 64)
    clock.now += ANONYMOUS_IDLE
    assert sessions.get(anonymous.session_id) is None
    assert sessions.get(signed.session_id) is not None
    clock.now += timedelta(seconds=1)
    for _ in range(MAX_SESSIONS + 5):
        sessions.new()
    assert len(sessions) == MAX_SESSIONS
    assert sessions.get(signed.session_id) is None  # the oldest went first


def test_a_csrf_token_matches_only_itself() -> None:
    session = Sessions().new()
    assert session.csrf_matches(session.csrf)
    assert not session.csrf_matches(None)
    assert not session.csrf_matches("")
    assert not session.csrf_matches(session.csrf[:-1])


async def test_the_queue_pages_with_the_service_cursor_and_keeps_its_filters(
    browser: httpx.AsyncClient, tokens: MemoryTokens, stack: LedgerStack
) -> None:
    """Every unknown call of the run appears exactly once across the pages, in queue order."""
    calls = s.Calls(stack)
    made = [(await calls.indeterminate("run-p", f"c{n:02}")).key for n in range(PAGE_SIZE + 5)]
    await calls.indeterminate("run-other")
    await _sign_in(browser, await s.token(tokens))
    seen: list[str] = []
    url: str | None = "/console/queue?status=indeterminate&run=run-p"
    pages = 0
    while url is not None:
        page = await browser.get(url)
        assert page.status_code == 200
        seen += re.findall(r'data-key="([^"]+)"', page.text)
        pages += 1
        following = re.search(r'<a rel="next" href="([^"]+)">Next page</a>', page.text)
        url = html.unescape(following.group(1)) if following else None
        if url is not None:
            assert "run=run-p" in url and "status=indeterminate" in url
    assert (pages, seen) == (2, made)


async def test_the_contested_view_lists_every_contested_call_and_nothing_else(
    browser: httpx.AsyncClient, tokens: MemoryTokens, stack: LedgerStack
) -> None:
    """A call an operator settled `failed` whose late completion proved an effect must be in
    the contested view (the store's flag, not a filter of one page), and a plain failure not."""
    calls = s.Calls(stack)
    disputed = await calls.indeterminate("run-d")
    service = OperatorService(stack.store, stack.commands, signing_keys=(s.SIGNING_KEY,))
    who = Operator(tenant_id="acme", operator="alice")
    await service.resolve(who, disputed.key, outcome="failed", reason="no credit found")
    late = await stack.commands.append_and_await(s.Calls.completed_of(disputed), 10)
    assert not late.accepted and late.call is not None and late.call.contested
    plain = await calls.failed("run-f")
    await _sign_in(browser, await s.token(tokens))
    page = await browser.get("/console/queue?status=contested")
    assert page.status_code == 200
    assert re.findall(r'data-key="([^"]+)"', page.text) == [disputed.key]
    everything = await browser.get("/console/queue?status=failed")
    assert set(re.findall(r'data-key="([^"]+)"', everything.text)) == {disputed.key, plain.key}
