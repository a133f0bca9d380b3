"""The operator API's contract suite: every route, its errors and compensations, per adapter.

`OperatorApiScenarios` states what the API does whatever ledger is under it: pagination,
validation, each decider refusal as a 409, the compensation paths, the body limit, health and
metrics, tokens. `tests/contract/test_operator_api.py` runs it on the embedded (memory) ledger
and on Kafka + PostgreSQL (`MemoryApi`, `PostgresApi`: the fixtures per adapter, which
`tests/integration/test_api.py` uses too for what only PostgreSQL has).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from tests import api_support as s
from tests.isolated import Isolated, running_stack
from toolledger.api import create_app
from toolledger.api.app import close_stack
from toolledger.api.service import OperatorService
from toolledger.api.tokens import MemoryTokens, PostgresTokens, TokenStore
from toolledger.errors import ConfigError
from toolledger.events.models import CompensationRequested, canonical_json
from toolledger.events.signing import sign
from toolledger.settings import OperatorSettings
from toolledger.wiring.stack import LedgerStack


class OperatorApiFixtures:
    """The app, its client and the call builder, over whatever `stack`, `tokens` and
    `api_settings` a subclass provides."""

    @pytest.fixture
    def app(
        self, stack: LedgerStack, api_settings: OperatorSettings, tokens: TokenStore
    ) -> FastAPI:
        return create_app(stack, api_settings, tokens=tokens, tools=s.TOOLS)

    @pytest.fixture
    def calls(self, stack: LedgerStack) -> s.Calls:
        return s.Calls(stack)

    @pytest.fixture
    async def api(self, app: FastAPI, tokens: TokenStore) -> AsyncIterator[httpx.AsyncClient]:
        async with s.client(app, await s.token(tokens)) as client:
            yield client

    @pytest.fixture(autouse=True)
    def _compensation_ok(self) -> None:
        s.compensation_mode["mode"] = "ok"
        s.voided.clear()


class MemoryApi(OperatorApiFixtures):
    """The embedded ledger, tokens in memory."""

    @pytest.fixture
    def api_settings(self) -> OperatorSettings:
        return s.api_settings()

    @pytest.fixture
    async def stack(self) -> AsyncIterator[LedgerStack]:
        stack = await LedgerStack.memory(verify_keys=s.KEYS)
        try:
            yield stack
        finally:
            await close_stack(stack)

    @pytest.fixture
    def tokens(self) -> MemoryTokens:
        return MemoryTokens()


class PostgresApi(OperatorApiFixtures):
    """Kafka and PostgreSQL: this test's schema and topics, an in-process projector, tokens in
    the schema's `api_tokens`."""

    @pytest.fixture
    def api_settings(self, isolated: Isolated) -> OperatorSettings:
        return s.api_settings(**isolated.connection())

    @pytest.fixture
    async def stack(self, api_settings: OperatorSettings) -> AsyncIterator[LedgerStack]:
        async with running_stack(api_settings) as stack:
            yield stack

    @pytest.fixture
    async def tokens(self, pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresTokens]:
        store = PostgresTokens(pg_dsn, pg_schema)
        await store.start()
        try:
            yield store
        finally:
            await store.close()


class OperatorApiScenarios:
    """What the operator API does on any ledger (subclassed with `MemoryApi` or `PostgresApi`)."""

    async def test_list_is_longest_waiting_first_and_pages_with_an_opaque_cursor(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        """Every call of the tenant, oldest change first, each exactly once across pages."""
        made = [(await calls.indeterminate(f"page-{n}")).key for n in range(5)]
        await calls.indeterminate("other-tenant", tenant="globex")
        seen: list[str] = []
        cursor = None
        for _ in range(4):
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = (await api.get("/v1/tool-executions", params=params)).json()
            seen += [item["key"] for item in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == made
        assert cursor is None

    async def test_list_filters_by_status_tool_and_run(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        unknown = await calls.indeterminate("filter-a")
        started = await calls.reserve("filter-b")
        await calls.completed("filter-c")
        got = await api.get("/v1/tool-executions", params={"status": "indeterminate, started"})
        assert {i["key"] for i in got.json()["items"]} == {unknown.key, started.key}
        got = await api.get("/v1/tool-executions", params={"run_id": "filter-b"})
        assert [i["key"] for i in got.json()["items"]] == [started.key]
        got = await api.get("/v1/tool-executions", params={"tool": "other.tool"})
        assert got.json()["items"] == []

    @pytest.mark.parametrize(
        ("params", "says"),
        [
            ({"status": "lost"}, "status"),
            ({"limit": 0}, "limit"),
            ({"limit": 501}, "limit"),
            ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
        ],
    )
    async def test_a_bad_listing_request_is_422_saying_which_part(
        self, api: httpx.AsyncClient, params: dict[str, str | int], says: str
    ) -> None:
        got = await api.get("/v1/tool-executions", params=params)
        assert got.status_code == 422
        assert says in got.json()["error"]["message"]

    async def test_show_gives_the_record_and_every_event_accepted_or_rejected(
        self, api: httpx.AsyncClient, calls: s.Calls, stack: LedgerStack
    ) -> None:
        r = await calls.indeterminate("show")
        late = s.Calls.completed_of(r)
        verdict = await stack.commands.append_and_await(late, 10)
        assert (verdict.accepted, verdict.reason) == (False, "late_outcome")
        body = (await api.get(f"/v1/tool-executions/{r.key}")).json()
        assert body["record"]["status"] == "indeterminate"
        assert body["record"]["arguments"] == {"account_id": "a-7", "amount_cents": 2500}
        events = [(h["event_type"], h["accepted"], h["reason"]) for h in body["history"]]
        assert events == [
            ("call_reserved", True, "accepted"),
            ("call_indeterminate", True, "accepted"),
            ("call_completed", False, "late_outcome"),
        ]
        assert body["history"][2]["event"]["reservation_id"] == str(r.reservation_id)
        stored = await stack.store.history(r.key)
        assert [h["chain_hash"] for h in body["history"]] == [h.chain_hash for h in stored]

    async def test_resolve_records_the_operator_the_reason_and_the_value(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        r = await calls.indeterminate("resolve")
        got = await api.post(
            f"/v1/tool-executions/{r.key}/resolve",
            json={
                "outcome": "completed",
                "reason": "  credit cr_81 found in the console  ",
                "value": {"credit_id": "cr_81"},
                "result_reference": "cr_81",
            },
        )
        assert got.status_code == 200, got.text
        record = got.json()
        assert (record["status"], record["settled_by"], record["operator"]) == (
            "completed",
            "operator",
            "alice",
        )
        assert record["reason"] == "credit cr_81 found in the console"
        assert (record["result"], record["result_reference"]) == ({"credit_id": "cr_81"}, "cr_81")

    async def test_a_decision_on_a_moved_record_is_409_with_the_record_as_it_is_now(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        r = await calls.indeterminate("moved")
        stale = await api.post(
            f"/v1/tool-executions/{r.key}/resolve",
            json={"outcome": "failed", "reason": "not in billing", "expected_version": 1},
        )
        assert stale.status_code == 409
        error = stale.json()["error"]
        assert error["code"] == "version_mismatch"
        assert (error["record"]["status"], error["record"]["version"]) == ("indeterminate", 2)

    async def test_a_started_call_within_its_deadline_is_409_saying_when_it_can_be_resolved(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        running = await calls.reserve("running", deadline_in=600)
        got = await api.post(
            f"/v1/tool-executions/{running.key}/resolve",
            json={"outcome": "failed", "reason": "looks stuck"},
        )
        assert got.status_code == 409
        error = got.json()["error"]
        assert error["code"] == "before_deadline"
        assert error["resolvable_after"] == error["record"]["resolvable_after"]
        assert error["resolvable_after"] > running.deadline.isoformat()[:19]
        overdue = await calls.reserve("overdue", deadline_in=-60)
        got = await api.post(
            f"/v1/tool-executions/{overdue.key}/resolve",
            json={"outcome": "failed", "reason": "the worker died; nothing in billing"},
        )
        assert got.status_code == 200
        assert got.json()["status"] == "failed"

    @pytest.mark.parametrize(
        "body",
        [
            {"outcome": "failed"},
            {"outcome": "failed", "reason": ""},
            {"outcome": "failed", "reason": "   "},
            {"outcome": "failed", "reason": "a\x00b"},
            {"outcome": "maybe", "reason": "checked"},
            {"outcome": "failed", "reason": "checked", "value": 1},
            {"outcome": "failed", "reason": "checked", "tenant_id": "globex"},
            {"outcome": "failed", "reason": "checked", "expected_version": -1},
        ],
    )
    async def test_a_malformed_resolve_is_422_and_appends_nothing(
        self, api: httpx.AsyncClient, calls: s.Calls, stack: LedgerStack, body: dict[str, object]
    ) -> None:
        r = await calls.indeterminate("malformed")
        got = await api.post(f"/v1/tool-executions/{r.key}/resolve", json=body)
        assert got.status_code == 422
        assert got.json()["error"]["message"]
        assert len(await stack.store.history(r.key)) == 2

    async def test_unknown_keys_are_404_on_every_route(self, api: httpx.AsyncClient) -> None:
        reason = {"reason": "checked"}
        for method, path, body in [
            ("GET", "/v1/tool-executions/nope:c1", None),
            ("POST", "/v1/tool-executions/nope:c1/resolve", {"outcome": "failed", **reason}),
            ("POST", "/v1/tool-executions/nope:c1/approve", reason),
            ("POST", "/v1/tool-executions/nope:c1/reject", reason),
            ("POST", "/v1/tool-executions/nope:c1/compensate", reason),
        ]:
            got = await api.request(method, path, json=body)
            assert got.status_code == 404, (path, got.text)
            assert got.json()["error"]["code"] == "not_found"

    async def test_approve_lets_a_call_run_and_reject_fails_it_not_attempted(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        a = await calls.reserve("approval-a", requires_approval=True)
        b = await calls.reserve("approval-b", requires_approval=True)
        got = await api.post(
            f"/v1/tool-executions/{a.key}/approve", json={"reason": "within limits"}
        )
        assert (got.status_code, got.json()["status"]) == (200, "approved")
        got = await api.post(f"/v1/tool-executions/{b.key}/reject", json={"reason": "too large"})
        assert got.status_code == 200
        assert (got.json()["status"], got.json()["not_attempted"]) == ("failed", True)
        again = await api.post(
            f"/v1/tool-executions/{a.key}/reject", json={"reason": "changed mind"}
        )
        assert (again.status_code, again.json()["error"]["code"]) == (409, "status_mismatch")

    async def test_compensation_runs_once_as_its_own_ledgered_call(
        self, api: httpx.AsyncClient, calls: s.Calls, stack: LedgerStack
    ) -> None:
        """Guarantee 7: the compensation is the call `<key>:compensate`; asking twice runs it
        once."""
        r = await calls.completed("comp")
        got = await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "refunded"})
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["record"]["status"] == "compensated"
        assert body["compensation"]["key"] == f"{r.key}:compensate"
        assert body["compensation"]["result"] == {"voided": r.key, "by": f"{r.key}:compensate"}
        again = await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "again"})
        assert (again.status_code, again.json()["error"]["code"]) == (409, "status_mismatch")
        assert s.voided == [r.key]
        history = [h.event_type for h in await stack.store.history(r.key)]
        assert history[-3:] == [
            "compensation_requested",
            "call_compensated",
            "compensation_requested",
        ]

    async def test_a_failed_compensation_leaves_the_call_completed_with_the_failure_recorded(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        s.compensation_mode["mode"] = "refuse"
        r = await calls.completed("comp-refused")
        body = (
            await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "refund"})
        ).json()
        assert body["record"]["status"] == "completed"
        assert "already paid out" in body["record"]["error"]
        assert body["compensation"]["status"] == "failed"
        s.compensation_mode["mode"] = "ok"
        retry = await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "retry"})
        assert retry.json()["record"]["status"] == "compensated"

    async def test_an_unknown_compensation_is_settled_by_resolving_its_own_key(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        """A compensation that timed out after sending is indeterminate, never retried by itself;
        resolving `<key>:compensate` settles the original call too."""
        s.compensation_mode["mode"] = "hang"
        r = await calls.completed("comp-unknown")
        body = (
            await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "refund"})
        ).json()
        assert body["record"]["status"] == "compensating"
        assert body["compensation"]["status"] == "indeterminate"
        again = await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "again"})
        assert again.json()["compensation"]["status"] == "indeterminate"
        resolved = await api.post(
            f"/v1/tool-executions/{r.key}:compensate/resolve",
            json={"outcome": "completed", "reason": "the void is in billing"},
        )
        assert resolved.status_code == 200, resolved.text
        shown = (await api.get(f"/v1/tool-executions/{r.key}")).json()
        assert shown["record"]["status"] == "compensated"

    async def test_compensation_is_refused_when_nothing_can_or_should_run(
        self,
        app: FastAPI,
        api: httpx.AsyncClient,
        calls: s.Calls,
        stack: LedgerStack,
        tokens: TokenStore,
    ) -> None:
        failed = await calls.failed("comp-failed")
        got = await api.post(f"/v1/tool-executions/{failed.key}/compensate", json={"reason": "x"})
        assert (got.status_code, got.json()["error"]["code"]) == (409, "nothing_to_undo")
        email = await calls.completed("comp-email", tool="billing.send_email")
        got = await api.post(f"/v1/tool-executions/{email.key}/compensate", json={"reason": "x"})
        assert got.status_code == 409
        assert "declares no compensation" in got.json()["error"]["message"]
        bare = create_app(stack, s.api_settings(), tokens=tokens)
        done = await calls.completed("comp-bare")
        async with s.client(bare, await s.token(tokens)) as c:
            got = await c.post(f"/v1/tool-executions/{done.key}/compensate", json={"reason": "x"})
        assert got.status_code == 409
        assert "--tools" in got.json()["error"]["message"]
        assert (await stack.store.get_call(done.key)).status == "completed"  # type: ignore[union-attr]

    async def test_concurrent_resolves_of_one_key_give_one_200_and_one_409(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        r = await calls.indeterminate("race")
        answers = await asyncio.gather(
            *(
                api.post(
                    f"/v1/tool-executions/{r.key}/resolve",
                    json={"outcome": outcome, "reason": f"operator {n} checked"},
                )
                for n, outcome in enumerate(("completed", "failed"))
            )
        )
        assert sorted(a.status_code for a in answers) == [200, 409]

    async def test_a_body_over_the_limit_is_413_before_any_route_runs(
        self, api: httpx.AsyncClient, calls: s.Calls, stack: LedgerStack
    ) -> None:
        r = await calls.indeterminate("big")
        huge = {"outcome": "completed", "reason": "x", "value": "v" * 70_000}
        got = await api.post(f"/v1/tool-executions/{r.key}/resolve", json=huge)
        assert (got.status_code, got.json()["error"]["code"]) == (413, "body_too_large")

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b" " * 4096

        chunked = await api.post(
            f"/v1/tool-executions/{r.key}/resolve",
            content=chunks(),
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 413
        assert len(await stack.store.history(r.key)) == 2

    async def test_every_error_has_the_one_error_shape(self, api: httpx.AsyncClient) -> None:
        for got in (await api.get("/v1/nothing-here"), await api.delete("/v1/tool-executions")):
            assert set(got.json()) == {"error"}
            assert {"code", "message"} <= set(got.json()["error"])

    async def test_health_readiness_and_metrics(
        self, app: FastAPI, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        await calls.indeterminate("metrics")
        assert (await api.get("/healthz")).json() == {"status": "ok", "checks": {}}
        assert (await api.get("/readyz")).status_code == 200
        await calls.indeterminate("metrics-2")
        await api.post(
            "/v1/tool-executions/metrics-2:c1/resolve", json={"outcome": "failed", "reason": "no"}
        )
        text = (await api.get("/metrics", headers=s.METRICS_AUTH)).text
        assert 'toolledger_ledger_calls{status="indeterminate"}' in text
        assert 'toolledger_unsettled_calls{older_than_seconds="0",status="indeterminate"}' in text
        assert 'toolledger_api_verdict_seconds_count{command="call_resolved"}' in text
        assert "toolledger_projector_lag_seconds" in text

    async def test_an_api_without_a_signing_key_refuses_to_start(self, stack: LedgerStack) -> None:
        with pytest.raises(ConfigError, match="TOOLLEDGER_SIGNING_KEYS"):
            create_app(stack, OperatorSettings())
        with pytest.raises(ConfigError, match="TOOLLEDGER_SIGNING_KEYS"):
            OperatorService(stack.store, stack.commands, signing_keys=())

    async def test_tokens_scope_every_request_to_their_tenant_and_role(
        self, app: FastAPI, tokens: TokenStore, calls: s.Calls
    ) -> None:
        """Tenant comes from the token only: globex sees none of acme's calls, even by key."""
        r = await calls.indeterminate("scoped")
        async with s.client(app, await s.token(tokens, tenant="globex")) as other:
            assert (await other.get("/v1/tool-executions")).json()["items"] == []
            assert (await other.get(f"/v1/tool-executions/{r.key}")).status_code == 404
            got = await other.post(
                f"/v1/tool-executions/{r.key}/resolve", json={"outcome": "failed", "reason": "x"}
            )
            assert got.status_code == 404
        async with s.client(app, await s.token(tokens, role="viewer")) as viewer:
            assert (await viewer.get(f"/v1/tool-executions/{r.key}")).status_code == 200
            got = await viewer.post(
                f"/v1/tool-executions/{r.key}/resolve", json={"outcome": "failed", "reason": "x"}
            )
            assert (got.status_code, got.json()["error"]["code"]) == (403, "forbidden")
        async with s.client(app) as anonymous:
            got = await anonymous.get("/v1/tool-executions")
            assert (got.status_code, got.json()["error"]["code"]) == (401, "missing_token")
            assert got.headers["www-authenticate"] == "Bearer"

    async def test_openapi_json_documents_bearer_auth_and_the_error_shape(
        self, app: FastAPI, api: httpx.AsyncClient
    ) -> None:
        served = (await api.get("/openapi.json")).json()
        assert served == app.openapi()
        assert served["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
        resolve = served["paths"]["/v1/tool-executions/{key}/resolve"]["post"]
        assert set(resolve["responses"]) == {"200", "401", "403", "404", "409", "413", "422", "503"}
        conflict = resolve["responses"]["409"]["content"]["application/json"]["schema"]
        assert conflict == {"$ref": "#/components/schemas/ErrorResponse"}

    async def test_asking_again_finishes_a_compensation_an_interrupted_request_left_undone(
        self, api: httpx.AsyncClient, calls: s.Calls, stack: LedgerStack
    ) -> None:
        """The request was accepted (`compensating`) but the process died before running the
        compensation: asking again runs it, once, and settles the call."""
        r = await calls.completed("comp-resume")
        requested = sign(
            CompensationRequested(
                key=r.key,
                run_id=r.run_id,
                tool_call_id=r.tool_call_id,
                tenant_id=r.tenant_id,
                operator="alice",
                reason="customer asked",
                expected_version=2,
            ),
            s.SIGNING_KEY,
        )
        record = await calls.apply(requested)
        assert record is not None and record.status == "compensating"
        got = await api.post(f"/v1/tool-executions/{r.key}/compensate", json={"reason": "finish"})
        assert got.status_code == 200, got.text
        assert got.json()["record"]["status"] == "compensated"
        assert s.voided == [r.key]

    async def test_contested_calls_are_listed_and_a_new_resolve_settles_them(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        """The queue must show the calls whose settlement a late outcome contradicted, and the
        operator's second decision must clear them (else they wait forever, unseen)."""
        r = await calls.indeterminate("contest")
        await calls.indeterminate("plain")
        body = {"outcome": "failed", "reason": "nothing in billing"}
        assert (
            await api.post(f"/v1/tool-executions/{r.key}/resolve", json=body)
        ).status_code == 200
        late = await calls.stack.commands.append_and_await(calls.completed_of(r), 10)
        assert (late.accepted, late.reason) == (False, "late_outcome")
        listed = (await api.get("/v1/tool-executions", params={"contested": "true"})).json()
        assert [item["key"] for item in listed["items"]] == [r.key]
        item = listed["items"][0]
        assert item["contested"] is True and "call_completed" in item["contested_evidence"]
        again = {
            "outcome": "completed",
            "reason": "found cr_1",
            "expected_version": item["version"],
        }
        settled = await api.post(f"/v1/tool-executions/{r.key}/resolve", json=again)
        assert settled.status_code == 200, settled.text
        assert (settled.json()["status"], settled.json()["contested"]) == ("completed", False)
        listed = (await api.get("/v1/tool-executions", params={"contested": "true"})).json()
        assert listed["items"] == []

    async def test_a_result_stored_by_reference_reads_back_as_if_inline(
        self, api: httpx.AsyncClient, calls: s.Calls
    ) -> None:
        """The API must show a large result, not the empty placeholder its record holds, and the
        history must show the request as appended with its payload restored."""
        big = {"rows": ["r" * 1000] * 200}  # 200 KB: over the 64 KB inline threshold
        r = await calls.reserve("by-ref")
        record = await calls.apply(
            calls.completed_of(r).model_copy(update={"result_json": canonical_json(big)})
        )
        assert record is not None and record.result_blob is not None and record.result_json == ""
        shown = (await api.get(f"/v1/tool-executions/{r.key}")).json()
        assert shown["record"]["result"] == big
        completed = [h for h in shown["history"] if h["event_type"] == "call_completed"]
        assert json.loads(completed[0]["event"]["result_json"]) == big
        assert completed[0]["event"]["result_blob"] == record.result_blob
        listed = (await api.get("/v1/tool-executions", params={"run_id": r.run_id})).json()
        assert listed["items"][0]["result"] == big
