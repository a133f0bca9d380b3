"""The operator API's contract suite on each ledger: the embedded one and Kafka + PostgreSQL.

The scenarios are `tests/operator_api_scenarios.py`'s; what only one adapter can show is here
(memory: a projector stopped under a request) or in `tests/integration/test_api.py`.
"""

from __future__ import annotations

from tests import api_support as s
from tests.operator_api_scenarios import MemoryApi, OperatorApiScenarios, PostgresApi
from toolledger.api import create_app
from toolledger.api.app import close_stack
from toolledger.api.service import OperatorService
from toolledger.api.tokens import MemoryTokens
from toolledger.wiring.stack import LedgerStack


class TestMemoryOperatorApi(MemoryApi, OperatorApiScenarios):
    async def test_a_command_without_a_verdict_is_503_and_the_api_stops_being_ready(
        self,
        tokens: MemoryTokens,
    ) -> None:
        """With the projector stopped, a decision must not hang or guess: 503 saying it may still
        apply, and /readyz turns 503 until a verdict comes again."""
        stack = await LedgerStack.memory(verify_keys=s.KEYS)
        try:
            r = await s.Calls(stack).indeterminate("stalled")
            assert stack.projector is not None
            stack.projector.stop()
            await stack.projector_task
            service = OperatorService(
                stack.store, stack.commands, signing_keys=(s.SIGNING_KEY,), verdict_timeout=0.3
            )
            app = create_app(service, s.api_settings(), tokens=tokens)
            async with s.client(app, await s.token(tokens)) as api:
                assert (await api.get("/readyz")).status_code == 200
                got = await api.post(
                    f"/v1/tool-executions/{r.key}/resolve",
                    json={"outcome": "failed", "reason": "x"},
                )
                assert (got.status_code, got.json()["error"]["code"]) == (503, "ledger_unavailable")
                assert "may still be applied" in got.json()["error"]["message"]
                ready = await api.get("/readyz")
                assert ready.status_code == 503
                assert "no verdict in time" in ready.json()["error"]["message"]
            with_stack = create_app(stack, s.api_settings(), tokens=tokens)
            async with s.client(with_stack) as probe:
                ready = await probe.get("/readyz")
                assert ready.status_code == 503
                assert "projector stopped" in ready.json()["error"]["message"]
        finally:
            await close_stack(stack)


class TestPostgresOperatorApi(PostgresApi, OperatorApiScenarios):
    pass
