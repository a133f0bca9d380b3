"""The operator API's trust edges against real Kafka and PostgreSQL (issue 15): it signs only
with a key the projectors verify, serves metrics only to the scrape token, and addresses any
key a framework may make; and the CLI takes the same keys."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest

from tests import api_support as s
from tests.isolated import Isolated, child_env, running_stack
from tests.run_tools import ScriptedModel, runs_billing
from toolledger.api.app import close_stack, create_app
from toolledger.api.tokens import PostgresTokens
from toolledger.errors import LedgerUnavailable
from toolledger.events.signing import SigningKey, VerifyKeys
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.pauses import resumable_runs
from toolledger.runtime.runs import AgentRun
from toolledger.wiring.stack import LedgerStack

#: Keys as agent frameworks make them: thread ids with paths, queries, fragments, percent
#: signs, spaces and any unicode; one ends in a route's action segment.
ODD_TOOL_CALL_IDS = [
    "thread/42/step/3",
    "a:b:c",
    "what?x=1&y=2",
    "frag#ment",
    "100%25 sure",
    "with space",
    "ünïcødé/✓",
    "call/resolve",
]


@pytest.fixture
def settings(isolated: Isolated) -> Any:
    return s.api_settings(**isolated.connection())


async def test_the_api_is_not_ready_and_appends_nothing_while_no_projector_knows_its_key(
    settings: Any, tokens: PostgresTokens
) -> None:
    """The issue's state: the API signs with a key the projectors lack. It used to answer
    500 on resolve while /readyz said ready (and a signed event with an unknown key id now
    halts a partition). The API must say it cannot sign (503 on /readyz and on the decision,
    naming the fix) and append nothing; once a projector verifies its key, both work."""
    other = SigningKey.from_seed("ops-other", b"a key the api does not sign with")
    projector = await LedgerStack.connect(
        settings.model_copy(update={"verify_keys": other.verify_keys()}), run_projector=True
    )
    try:
        calls = s.Calls(projector)
        r = await calls.indeterminate("unsignable")
        app = create_app(projector, settings, tokens=tokens)
        async with s.client(app, await s.token(tokens)) as api:
            ready = await api.get("/readyz")
            assert ready.status_code == 503
            message = ready.json()["error"]["message"]
            assert "deploy keys before signers" in message and s.KEY_ID in message
            assert s.SIGNING_KEY.public_setting() in message
            got = await api.post(
                f"/v1/tool-executions/{r.key}/resolve", json={"outcome": "failed", "reason": "x"}
            )
            assert (got.status_code, got.json()["error"]["code"]) == (503, "cannot_sign")
        history = await projector.store.history(r.key)
        assert [h.event_type for h in history] == ["call_reserved", "call_indeterminate"]
        assert projector.projector is not None and not projector.projector.stats.halted
    finally:
        await close_stack(projector)

    both = settings.model_copy(
        update={"verify_keys": VerifyKeys({**other.verify_keys().raw, **s.KEYS.raw})}
    )
    projector = await LedgerStack.connect(both, run_projector=True)
    try:
        app = create_app(projector, settings, tokens=tokens)
        async with s.client(app, await s.token(tokens)) as api:
            assert (await api.get("/readyz")).status_code == 200
            got = await api.post(
                f"/v1/tool-executions/{r.key}/resolve", json={"outcome": "failed", "reason": "x"}
            )
            assert got.status_code == 200, got.text
    finally:
        await close_stack(projector)


@pytest.fixture
async def stack(settings: Any) -> AsyncIterator[LedgerStack]:
    async with running_stack(settings) as stack:
        yield stack


async def test_keys_with_any_character_a_thread_id_may_hold_are_addressable_over_http(
    stack: LedgerStack, settings: Any, tokens: PostgresTokens
) -> None:
    """A tool_call_id with `/` (or `?`, `#`, `%`, spaces, unicode) used to get "no such
    endpoint": every such key must be shown and resolved through its percent-encoded path."""
    calls = s.Calls(stack)
    app = create_app(stack, settings, tokens=tokens)
    async with s.client(app, await s.token(tokens)) as api:
        for n, tool_call_id in enumerate(ODD_TOOL_CALL_IDS):
            r = await calls.indeterminate(f"odd{n}", tool_call_id)
            path = f"/v1/tool-executions/{quote(r.key, safe='')}"
            shown = await api.get(path)
            assert shown.status_code == 200, (r.key, shown.text)
            assert shown.json()["record"]["key"] == r.key
            resolved = await api.post(
                f"{path}/resolve", json={"outcome": "failed", "reason": "checked"}
            )
            assert resolved.status_code == 200, (r.key, resolved.text)
            assert resolved.json()["key"] == r.key
            assert resolved.json()["status"] == "failed"
        literal = await api.get(f"/v1/tool-executions/odd0:{ODD_TOOL_CALL_IDS[0]}")
        assert literal.status_code == 200 and literal.json()["record"]["key"].endswith("step/3")


async def test_the_cli_takes_the_same_keys(stack: LedgerStack, settings: Any) -> None:
    """`toolledger executions show|resolve KEY` must find a key with `/`, spaces or `#`."""
    calls = s.Calls(stack)
    env = {
        **os.environ,
        **child_env(settings),
        "TOOLLEDGER_SIGNING_KEYS": s.SIGNING_KEY.setting(),
        "COLUMNS": "250",
    }
    for n, tool_call_id in enumerate(("thread/7/x", "with space #1")):
        r = await calls.indeterminate(f"cli{n}", tool_call_id)
        for args in (
            ("show", r.key),
            ("resolve", r.key, "--outcome", "failed", "--reason", "checked"),
        ):
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "toolledger", "executions", *args, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(process.communicate(), 60)
            assert process.returncode == 0, err.decode()
            assert r.key in out.decode()
        record = await stack.store.get_call(r.key)
        assert record is not None and record.status == "failed"


async def test_metrics_are_served_only_to_the_scrape_token(
    stack: LedgerStack, settings: Any, tokens: PostgresTokens
) -> None:
    """/metrics counts every tenant's calls. Without a token, or with a tenant's API token, it
    must answer 401 and show nothing; with the scrape token, the metrics; with no scrape token
    configured it is not served at all."""
    await s.Calls(stack).indeterminate("metered")
    app = create_app(stack, settings, tokens=tokens)
    tenant_token = await s.token(tokens)
    async with s.client(app) as anonymous, s.client(app, tenant_token) as tenant:
        for client in (anonymous, tenant):
            got = await client.get("/metrics")
            assert (got.status_code, got.json()["error"]["code"]) == (401, "unauthorized")
            assert "acme" not in got.text and "toolledger_" not in got.text
        scraped = await anonymous.get("/metrics", headers=s.METRICS_AUTH)
        assert scraped.status_code == 200
        assert 'toolledger_ledger_calls{status="indeterminate"}' in scraped.text
    unserved = create_app(stack, settings.model_copy(update={"metrics_token": None}), tokens=tokens)
    async with s.client(unserved) as anonymous:
        got = await anonymous.get("/metrics", headers=s.METRICS_AUTH)
        assert (got.status_code, got.json()["error"]["code"]) == (404, "metrics_disabled")


async def test_an_agent_run_reports_a_store_error_as_ledger_unavailable(
    stack: LedgerStack, pg_dsn: str, pg_schema: str
) -> None:
    """AgentRun read runs and calls straight from the store and let asyncpg's exceptions out,
    bypassing the runtime's fail-closed translation: a store that cannot be read must reach
    the caller as LedgerUnavailable, nothing run."""
    ledger = Ledger.from_stack(stack, verdict_timeout=5)
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'ALTER TABLE "{pg_schema}".runs RENAME TO runs_away')
        run = AgentRun(
            ledger, run_id="lost", tenant_id="acme", agent=AgentConfig(name="billing"),
            tools=runs_billing, model=ScriptedModel(),
        )  # fmt: skip
        with pytest.raises(LedgerUnavailable, match="run lost"):
            await run.resume()
        with pytest.raises(LedgerUnavailable, match="runs"):
            await anext(aiter(resumable_runs(ledger, follow=False)))
    finally:
        await conn.execute(f'ALTER TABLE "{pg_schema}".runs_away RENAME TO runs')
        await conn.close()
