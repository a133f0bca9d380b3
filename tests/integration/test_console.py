"""The operator console in a real browser, against real Kafka and PostgreSQL.

Each test serves `toolledger api`'s app (`create_app`, the console included) with uvicorn on a
free port, over a stack with an in-process projector, so every click takes the production
path: form, `OperatorService`, signed event on Kafka, decider, PostgreSQL, verdict. Every
operator gets their own Chromium with a fresh profile under the test's tmp_path (two operators
are two browsers, as on two desks). Screenshots of the queue and the detail page are written
under tmp_path; with TOOLLEDGER_SCREENSHOTS=<dir> they are also copied there. docs/img/ holds
those two, reduced to a 32-colour palette (Pillow's `quantize`, outside the project) to stay
small.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from playwright.async_api import BrowserContext, Page, Playwright, async_playwright, expect

from tests import api_support as s
from tests.browser import CHROMIUM_ARGS, chromium_path, serve
from tests.isolated import Isolated, running_stack
from toolledger import Ledger, ToolCallIndeterminate, ToolContext, Toolset, external
from toolledger.api import create_app
from toolledger.api.console.web import dom_id
from toolledger.api.tokens import PostgresTokens, Role
from toolledger.events.models import RunCheckpointed, RunPaused, RunStarted
from toolledger.settings import OperatorSettings
from toolledger.wiring.stack import LedgerStack

# The browser install (first test only) is not part of a test's time; the test body is.
pytestmark = pytest.mark.timeout(120, func_only=True)

#: A form as Playwright's request API types it.
Form = dict[str, str | float | bool]

payments = Toolset("payments")


@payments.tool(external(), timeout=5)
async def send_payout(account_id: str, amount_cents: int, context: ToolContext) -> str:
    """A payout whose bank never answers after the request left: the call is indeterminate."""
    async with context.sending():
        raise TimeoutError("the bank did not answer within 5 s")


@pytest.fixture
def settings(isolated: Isolated) -> OperatorSettings:
    return s.api_settings(**isolated.connection())


@pytest.fixture
async def stack(settings: OperatorSettings) -> AsyncIterator[LedgerStack]:
    async with running_stack(settings) as stack:
        yield stack


@pytest.fixture
async def console(
    stack: LedgerStack, settings: OperatorSettings, tokens: PostgresTokens
) -> AsyncIterator[str]:
    app: FastAPI = create_app(stack, settings, tokens=tokens, tools=s.TOOLS)
    async with serve(app) as base:
        yield base


@pytest.fixture
async def playwright() -> AsyncIterator[Playwright]:
    chromium_path()
    async with async_playwright() as pw:
        yield pw


@pytest.fixture(autouse=True)
def _compensation_ok() -> None:
    s.compensation_mode["mode"] = "ok"
    s.voided.clear()


class Desk:
    """One operator's browser, signed in to the console."""

    def __init__(self, base: str, context: BrowserContext, page: Page) -> None:
        self.base = base
        self.context = context
        self.page = page

    async def open(self, key: str, view: str = "unsettled") -> None:
        """Open a call from the queue filtered by its run, as an operator would find it."""
        run_id = key.split(":", 1)[0]
        await self.page.goto(f"{self.base}/console/queue?status={view}&run={run_id}")
        await self.page.locator(f'tr[data-key="{key}"]').get_by_role("link", name=key).click()
        await expect(self.page.get_by_role("heading", level=1)).to_have_text(f"Call {key}")

    async def csrf(self) -> str:
        token = await self.page.locator('input[name="csrf_token"]').first.get_attribute("value")
        assert token
        return token


@contextlib.asynccontextmanager
async def desk(
    playwright: Playwright,
    tmp_path: Path,
    base: str,
    tokens: PostgresTokens,
    name: str,
    *,
    tenant: str = "acme",
    role: Role = "operator",
) -> AsyncIterator[Desk]:
    """A fresh Chromium profile for `name`, signed in with a new token of theirs."""
    context = await playwright.chromium.launch_persistent_context(
        tmp_path / f"chromium-{name}",
        executable_path=chromium_path(),
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": 1200, "height": 800},
    )
    try:
        page = context.pages[0] if context.pages else await context.new_page()
        bearer = await s.token(tokens, tenant=tenant, role=role, operator=name)
        await page.goto(f"{base}/console/queue")
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await page.get_by_label("API token").fill(bearer)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("heading", name="Queue")).to_be_visible()
        await expect(page.locator("header .who")).to_contain_text(f"{name} · tenant {tenant}")
        yield Desk(base, context, page)
    finally:
        await context.close()


async def _shoot(page: Page, path: Path) -> None:
    await page.screenshot(path=path, full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    copy_to = os.environ.get("TOOLLEDGER_SCREENSHOTS")
    if copy_to:
        shutil.copy(path, Path(copy_to) / f"console-{path.name}")


async def test_an_operator_resolves_a_real_unknown_call_and_a_stale_second_operator_sees_the_winner(
    console: str,
    stack: LedgerStack,
    tokens: PostgresTokens,
    playwright: Playwright,
    tmp_path: Path,
) -> None:
    """An indeterminate payout made by a real `ledger.call` is in the queue (its key holds `:`
    and `/`); alice resolves it with a reason and sees it in the history; bob, whose page still
    shows the old version, is refused (409) and told who settled it and why."""
    key = "run-7:toolu/01"
    calls = s.Calls(stack)
    run = {"key": "run-7", "run_id": "run-7", "tenant_id": "acme"}
    await calls.apply(RunStarted(**run, agent="payout-bot"))
    await calls.apply(RunCheckpointed(**run, expected_version=0, tool_call_ids=("toolu/01",)))
    ledger = Ledger.from_stack(stack)
    with pytest.raises(ToolCallIndeterminate):
        await ledger.call(
            send_payout,
            run_id="run-7",
            tool_call_id="toolu/01",
            tenant_id="acme",
            arguments={"account_id": "a-7", "amount_cents": 2500},
            run_version=1,
        )
    await calls.apply(
        RunPaused(**run, expected_version=1, reason="awaiting_reconciliation", waiting_on=key)
    )
    await calls.reserve("run-8", requires_approval=True)
    await calls.reserve("run-9", deadline_in=-60)
    await calls.reserve("run-9", "c2")  # still within its deadline: not an operator's yet

    async with (
        desk(playwright, tmp_path, console, tokens, "alice") as alice,
        desk(playwright, tmp_path, console, tokens, "bob") as bob,
    ):
        page = alice.page
        row = page.locator(f"#{dom_id(key)}")
        await expect(row).to_contain_text("indeterminate")
        await expect(row).to_contain_text("payments.send_payout")
        await expect(row).to_contain_text("the bank did not answer")
        await expect(row.locator("td").nth(5)).to_have_text("1")  # attempts: the tool ran once
        keys = await page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
        # Longest-waiting first: run-9's call was reserved two minutes ago (see `Calls.reserve`).
        assert keys == ["run-9:c1", key, "run-8:c1"]
        counts = page.get_by_role("region", name="Calls per status")
        await expect(counts).to_contain_text("1 indeterminate")
        await expect(counts).to_contain_text("1 started, past deadline")
        await expect(counts).to_contain_text("1 awaiting approval")
        await _shoot(page, tmp_path / "queue.png")

        await bob.open(key)  # bob looks at version 2 and leaves the page open
        await alice.open(key)
        assert "key=run-7%3Atoolu%2F01" in page.url
        await expect(page.locator(".run-state")).to_contain_text(
            "awaiting reconciliation: paused until its unknown calls are settled"
        )
        await page.get_by_label("Completed: the effect happened").check()
        await page.get_by_label("Result, if completed (JSON, optional)").fill('{"payout": "po_7"}')
        await page.get_by_label("Reason (required)").fill("payout po_7 is in the bank portal")
        async with page.expect_response(lambda r: r.request.method == "POST") as answer:
            await page.get_by_role("button", name="Resolve").click()
        assert (await answer.value).status == 200
        await expect(page.get_by_role("heading", level=1)).to_have_text("Applied: resolve")
        await expect(page.get_by_role("table", name=f"Record of {key}")).to_contain_text(
            "completed"
        )
        await page.get_by_role("link", name="Open the call").click()
        history = page.get_by_role("table", name=f"History of {key}")
        decision = history.locator("tr", has_text="call_resolved")
        await expect(decision).to_contain_text("operator:alice")
        await expect(decision).to_contain_text("payout po_7 is in the bank portal")
        await expect(page.locator(".chain")).to_contain_text("Chain intact: 3 entries")
        await expect(page.get_by_role("button", name="Resolve")).to_have_count(0)

        late = bob.page
        await late.get_by_label("Failed: it definitely did not happen").check()
        await late.get_by_label("Reason (required)").fill("no payout found")
        async with late.expect_response(lambda r: r.request.method == "POST") as answer:
            await late.get_by_role("button", name="Resolve").click()
        assert (await answer.value).status == 409
        await expect(late.get_by_role("heading", level=1)).to_have_text(
            "Not applied: the call moved on"
        )
        await expect(late.locator(".winner")).to_contain_text(
            "Settled by operator alice: “payout po_7 is in the bank portal”"
        )
        await expect(late.get_by_role("alert")).to_contain_text("is completed (version 3)")

        await page.reload()
        stale = history.locator("tr", has_text="operator:bob")
        await expect(stale).to_contain_text("status_mismatch")
        await expect(stale).to_contain_text("rejected: kept as evidence, did not change the call")
        await expect(page.locator(".chain")).to_contain_text("Chain intact: 4 entries")
        await _shoot(page, tmp_path / "detail.png")

    record = await stack.store.get_call(key)
    assert record is not None
    assert (record.status, record.operator, record.result_json) == (
        "completed",
        "alice",
        '{"payout":"po_7"}',
    )
    refused = [h for h in await stack.store.history(key) if not h.accepted]
    assert [(h.event_type, h.actor) for h in refused] == [("call_resolved", "operator:bob")]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["detail.png", "queue.png"]


async def test_an_operator_approves_rejects_and_compensates_from_the_console(
    console: str,
    stack: LedgerStack,
    tokens: PostgresTokens,
    playwright: Playwright,
    tmp_path: Path,
) -> None:
    """Approval, rejection and compensation each go through the form to the ledger, and the
    answer page shows the record the ledger now holds (compensation: both calls)."""
    calls = s.Calls(stack)
    waiting = await calls.reserve("run-a", requires_approval=True)
    refused = await calls.reserve("run-b", requires_approval=True)
    done = await calls.completed("run-c")

    async with desk(playwright, tmp_path, console, tokens, "carol") as carol:
        page = carol.page
        await carol.open(waiting.key)
        await page.get_by_label("Reason (required)").fill("amount within the customer's limit")
        await page.get_by_role("button", name="Approve").click()
        await expect(page.get_by_role("heading", level=1)).to_have_text("Applied: approve")
        await expect(page.locator(".record")).to_contain_text("approved")

        await carol.open(refused.key)
        await page.get_by_label("Reason (required)").fill("duplicate of an earlier credit")
        await page.get_by_role("button", name="Reject").click()
        await expect(page.get_by_role("heading", level=1)).to_have_text("Applied: reject")
        await expect(page.locator(".record")).to_contain_text("failed (not attempted)")

        await carol.open(done.key, view="completed")
        await page.get_by_label("Reason (required)").fill("customer refunded by hand")
        await page.get_by_role("button", name="Compensate").click()
        await expect(page.get_by_role("heading", level=1)).to_have_text("Applied: compensate")
        await expect(
            page.get_by_role("table", name=f"Record of {done.key}", exact=True)
        ).to_contain_text("compensated")
        compensation = page.get_by_role("table", name=f"Record of {done.key}:compensate")
        await expect(compensation).to_contain_text("completed")

    by_key = {k: await stack.store.get_call(k) for k in (waiting.key, refused.key, done.key)}
    statuses = {k: r.status for k, r in by_key.items() if r is not None}
    assert statuses == {waiting.key: "approved", refused.key: "failed", done.key: "compensated"}
    assert s.voided == [done.key]
    requested = [h for h in await stack.store.history(done.key) if h.accepted]
    assert ("compensation_requested", "operator:carol") in [
        (h.event_type, h.actor) for h in requested
    ]


async def test_a_viewer_has_no_controls_and_forged_or_csrf_less_posts_are_refused(
    console: str,
    stack: LedgerStack,
    tokens: PostgresTokens,
    playwright: Playwright,
    tmp_path: Path,
) -> None:
    """A viewer's page has no decision buttons, and a resolve posted with the viewer's own
    session and CSRF token is refused (403) anyway; an operator's post without the CSRF token,
    or with a wrong one, is refused (403) with a message. The call stays as it was."""
    unknown = await s.Calls(stack).indeterminate("run-v", "call/9")
    before = await stack.store.get_call(unknown.key)
    async with (
        desk(playwright, tmp_path, console, tokens, "victor", role="viewer") as viewer,
        desk(playwright, tmp_path, console, tokens, "olga") as operator,
    ):
        await viewer.open(unknown.key)
        await expect(viewer.page.locator("main form")).to_have_count(0)
        await expect(viewer.page.locator("main button")).to_have_count(0)
        await expect(viewer.page.get_by_role("button")).to_have_text(["Sign out"])

        form: Form = {
            "csrf_token": await viewer.csrf(),
            "key": unknown.key,
            "outcome": "failed",
            "reason": "forged by a viewer",
        }
        forged = await viewer.context.request.post(
            f"{console}/console/call/resolve", form=form, max_redirects=0
        )
        assert forged.status == 403
        assert "has role viewer; this needs role operator" in await forged.text()

        await operator.open(unknown.key)
        form = {"key": unknown.key, "outcome": "failed", "reason": "no CSRF token"}
        sent: Form
        for csrf in (None, "not-the-session-token"):
            sent = form if csrf is None else {**form, "csrf_token": csrf}
            answer = await operator.context.request.post(
                f"{console}/console/call/resolve", form=sent, max_redirects=0
            )
            assert answer.status == 403
            assert "CSRF token is missing or wrong" in await answer.text()

    assert await stack.store.get_call(unknown.key) == before
    assert "call_resolved" not in [h.event_type for h in await stack.store.history(unknown.key)]


async def test_tenant_b_sees_nothing_of_tenant_a(
    console: str,
    stack: LedgerStack,
    tokens: PostgresTokens,
    playwright: Playwright,
    tmp_path: Path,
) -> None:
    """Globex's operator sees none of acme's calls in the queue or its counts, gets "not
    found" for acme's key, and cannot resolve it by posting its key."""
    calls = s.Calls(stack)
    secret = await calls.indeterminate("run-acme")
    own = await calls.indeterminate("run-globex", tenant="globex")
    before = await stack.store.get_call(secret.key)
    async with desk(playwright, tmp_path, console, tokens, "gus", tenant="globex") as gus:
        page = gus.page
        await page.goto(f"{console}/console/queue?status=indeterminate")
        keys = await page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
        assert keys == [own.key]
        counts = page.get_by_role("region", name="Calls per status")
        await expect(counts).to_contain_text("1 indeterminate")
        await page.goto(f"{console}/console/queue?status=unsettled&run=run-acme")
        await expect(page.get_by_role("status")).to_contain_text("Nothing here")

        shown = await page.goto(f"{console}/console/call?key={secret.key}")
        assert shown is not None and shown.status == 404
        await expect(page.get_by_role("alert")).to_contain_text("no tool execution")
        await expect(page.locator("main")).not_to_contain_text("a-7")

        form: Form = {
            "csrf_token": await gus.csrf(),
            "key": secret.key,
            "outcome": "failed",
            "reason": "reaching across tenants",
        }
        answer = await gus.context.request.post(f"{console}/console/call/resolve", form=form)
        assert answer.status == 404
    assert await stack.store.get_call(secret.key) == before
