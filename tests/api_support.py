"""What the operator-API tests share: settings, calls put into the ledger, tokens, clients, tools.

Calls are made by appending the runtime's own requests through `LedgerCommands`, with deadlines
relative to the real clock (the API stamps its decisions with the real time): a call reserved
with `deadline_in=-60` is a `started` call an operator may resolve now, one with the default is
still within its deadline.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx
from fastapi import FastAPI

from toolledger import ToolContext, ToolExecutionRecord, ToolFailedError, Toolset, external
from toolledger.api.tokens import Role, TokenStore
from toolledger.events.models import (
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallReserved,
    args_digest,
    call_key,
    canonical_json,
    utcnow,
)
from toolledger.events.records import CallRecord
from toolledger.events.signing import SigningKey
from toolledger.settings import OperatorSettings, ProjectorSettings
from toolledger.wiring.stack import LedgerStack

KEY_ID = "api-k1"
SIGNING_KEY = SigningKey.from_seed(KEY_ID, b"api-operator-signing-key-32bytes")
KEYS = SIGNING_KEY.verify_keys()
METRICS_TOKEN = "scrape-token-for-tests"
METRICS_AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}
TOOL = "billing.issue_credit"


class OneProcessSettings(OperatorSettings, ProjectorSettings):
    """A test process that plays the API and the projector at once: both roles' settings."""


def api_settings(**overrides: Any) -> OneProcessSettings:
    return OneProcessSettings(
        **{
            "signing_keys": (SIGNING_KEY,),
            "verify_keys": KEYS,
            "metrics_token": METRICS_TOKEN,
            "verdict_timeout_s": 10.0,
            **overrides,
        }
    )


class Calls:
    """Puts calls into a stack's ledger in a chosen state, as a runtime would."""

    def __init__(self, stack: LedgerStack) -> None:
        self.stack = stack

    async def reserve(
        self,
        run_id: str | None = None,
        tool_call_id: str = "c1",
        *,
        tenant: str = "acme",
        deadline_in: float = 600,
        tool: str = TOOL,
        requires_approval: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> CallReserved:
        run_id = run_id or f"run-{uuid.uuid4().hex[:8]}"
        args = arguments if arguments is not None else {"account_id": "a-7", "amount_cents": 2500}
        now = utcnow()
        reserved = CallReserved(
            key=call_key(run_id, tool_call_id),
            run_id=run_id,
            tool_call_id=tool_call_id,
            tenant_id=tenant,
            occurred_at=now - timedelta(seconds=120) if deadline_in < 0 else now,
            tool=tool,
            effect="external",
            args_digest=args_digest(args),
            arguments_json=canonical_json(args),
            requires_approval=requires_approval,
            deadline=now + timedelta(seconds=deadline_in),
        )
        verdict = await self.stack.commands.append_and_await(reserved, 10)
        assert verdict.accepted, verdict.detail
        return reserved

    async def indeterminate(
        self, run_id: str | None = None, tool_call_id: str = "c1", **kw: Any
    ) -> CallReserved:
        r = await self.reserve(run_id, tool_call_id, **kw)
        await self.apply(self.indeterminate_of(r))
        return r

    async def completed(
        self, run_id: str | None = None, tool_call_id: str = "c1", **kw: Any
    ) -> CallReserved:
        r = await self.reserve(run_id, tool_call_id, **kw)
        await self.apply(self.completed_of(r))
        return r

    async def failed(
        self, run_id: str | None = None, tool_call_id: str = "c1", **kw: Any
    ) -> CallReserved:
        r = await self.reserve(run_id, tool_call_id, **kw)
        await self.apply(
            CallFailed(**_envelope(r), reservation_id=r.reservation_id, error="declined")
        )
        return r

    async def apply(self, event: Any) -> CallRecord | None:
        verdict = await self.stack.commands.append_and_await(event, 10)
        assert verdict.accepted, verdict.detail
        return verdict.call

    @staticmethod
    def indeterminate_of(r: CallReserved) -> CallIndeterminate:
        return CallIndeterminate(**_envelope(r), reservation_id=r.reservation_id, error="timeout")

    @staticmethod
    def completed_of(r: CallReserved, **fields: Any) -> CallCompleted:
        result = {"credit_id": "cr_1", "account_id": "a-7", "amount_cents": 2500}
        return CallCompleted(
            **_envelope(r),
            reservation_id=r.reservation_id,
            result_json=canonical_json(result),
            **fields,
        )


def _envelope(r: CallReserved) -> dict[str, Any]:
    return {
        "key": r.key,
        "run_id": r.run_id,
        "tool_call_id": r.tool_call_id,
        "tenant_id": r.tenant_id,
    }


async def token(
    tokens: TokenStore,
    *,
    tenant: str = "acme",
    role: Role = "operator",
    operator: str = "alice",
    ttl: timedelta = timedelta(hours=1),
) -> str:
    return (await tokens.create(tenant, operator, role, ttl)).token


def client(app: FastAPI, bearer: str | None = None) -> httpx.AsyncClient:
    headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=headers
    )


# A toolset whose compensation the API can run. `voided` records what the hook undid;
# `compensation_mode` makes the hook fail definitely or time out (an unknown compensation).
voided: list[str] = []
compensation_mode = {"mode": "ok"}
billing = Toolset("billing")


async def void_credit(record: ToolExecutionRecord, context: ToolContext) -> dict[str, str]:
    """Void the credit the call made (looked up by the call's idempotency key)."""
    mode = compensation_mode["mode"]
    if mode == "refuse":
        raise ToolFailedError("the credit was already paid out; it cannot be voided")
    async with context.sending():
        if mode == "hang":
            raise TimeoutError("the billing system did not answer")
        voided.append(record.idempotency_key)
    return {"voided": record.idempotency_key, "by": context.idempotency_key}


@billing.tool(external(), compensation=void_credit, timeout=5)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> dict[str, Any]:
    """Credit an account (never run by these tests: calls are put into the ledger directly)."""
    return {"credit_id": "cr_1", "account_id": account_id, "amount_cents": amount_cents}


@billing.tool(external(), timeout=5)
async def send_email(to: str, context: ToolContext) -> None:
    """A tool with no compensation."""


TOOLS = {t.name: t for t in billing}
