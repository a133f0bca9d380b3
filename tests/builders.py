"""Short constructors for events in tests, with a clock the test controls.

The decider reads time only from events, so tests pass explicit `at` times instead of sleeping.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict

from toolledger.events.models import (
    CallAbandoned,
    CallApproved,
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallRejected,
    CallReserved,
    CallResolved,
    CompensationRequested,
    Producer,
    ReconcileAttempted,
    RunCheckpointed,
    RunStarted,
    args_digest,
    call_key,
)
from toolledger.events.signing import SigningKey, sign

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY_ID = "k1"
#: A fixed key, so signed fixtures are reproducible (Ed25519 signatures are deterministic).
SIGNING_KEY = SigningKey.from_seed(KEY_ID, bytes(range(32)))
KEYS = SIGNING_KEY.verify_keys()
PRODUCER = Producer(host="test-host", pid=4242)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reserved(
    run_id: str = "r1",
    tool_call_id: str = "c1",
    *,
    tenant: str = "acme",
    arguments: dict[str, object] | None = None,
    run_version: int | None = None,
    requires_approval: bool = False,
    t: float = 0,
    timeout: float = 30,
    reservation_id: uuid.UUID | None = None,
) -> CallReserved:
    args = arguments if arguments is not None else {"amount_cents": 2500}
    return CallReserved(
        key=call_key(run_id, tool_call_id),
        run_id=run_id,
        tool_call_id=tool_call_id,
        tenant_id=tenant,
        occurred_at=at(t),
        producer=PRODUCER,
        reservation_id=reservation_id or uuid.uuid4(),
        run_version=run_version,
        tool="billing.issue_credit",
        effect="external",
        args_digest=args_digest(args),
        arguments_json='{"amount_cents":2500}',
        requires_approval=requires_approval,
        deadline=at(t + timeout),
    )


class _Envelope(TypedDict):
    key: str
    run_id: str
    tool_call_id: str
    tenant_id: str
    occurred_at: datetime
    producer: Producer


def _common(r: CallReserved, t: float, tenant: str | None = None) -> _Envelope:
    return {
        "key": r.key,
        "run_id": r.run_id,
        "tool_call_id": r.tool_call_id,
        "tenant_id": tenant or r.tenant_id,
        "occurred_at": at(t),
        "producer": PRODUCER,
    }


def completed(r: CallReserved, *, t: float = 1, result: str = '{"ok":true}') -> CallCompleted:
    return CallCompleted(**_common(r, t), reservation_id=r.reservation_id, result_json=result)


def failed(r: CallReserved, *, t: float = 1, not_attempted: bool = False) -> CallFailed:
    return CallFailed(
        **_common(r, t),
        reservation_id=r.reservation_id,
        error="boom",
        not_attempted=not_attempted,
    )


def indeterminate(r: CallReserved, *, t: float = 1) -> CallIndeterminate:
    return CallIndeterminate(**_common(r, t), reservation_id=r.reservation_id, error="timeout")


def abandoned(r: CallReserved, *, t: float = 1) -> CallAbandoned:
    return CallAbandoned(**_common(r, t), reservation_id=r.reservation_id)


def found(r: CallReserved, version: int, *, t: float = 2) -> CallCompleted:
    return CallCompleted(
        **_common(r, t),
        reservation_id=r.reservation_id,
        result_json='{"found":true}',
        result_reference="cr_1",
        source="reconcile",
        expected_version=version,
    )


def not_found(r: CallReserved, version: int, *, t: float = 2) -> CallFailed:
    return CallFailed(
        **_common(r, t),
        reservation_id=r.reservation_id,
        error="no such credit",
        source="reconcile",
        expected_version=version,
    )


def attempted(r: CallReserved, version: int, *, t: float = 2) -> ReconcileAttempted:
    return ReconcileAttempted(
        **_common(r, t),
        reservation_id=r.reservation_id,
        expected_version=version,
        attempt=1,
    )


def resolved(
    r: CallReserved,
    version: int,
    *,
    outcome: Literal["completed", "failed"] = "failed",
    t: float = 100,
    signed: bool = True,
    tenant: str | None = None,
) -> CallResolved:
    e = CallResolved(
        **_common(r, t, tenant),
        operator="alice",
        reason="checked the billing console",
        expected_version=version,
        outcome=outcome,
    )
    return sign(e, SIGNING_KEY) if signed else e


def approved(r: CallReserved, version: int, *, t: float = 5, signed: bool = True) -> CallApproved:
    e = CallApproved(
        **_common(r, t),
        operator="alice",
        reason="looks right",
        expected_version=version,
    )
    return sign(e, SIGNING_KEY) if signed else e


def rejected(r: CallReserved, version: int, *, t: float = 5) -> CallRejected:
    e = CallRejected(
        **_common(r, t),
        operator="alice",
        reason="too large",
        expected_version=version,
    )
    return sign(e, SIGNING_KEY)


def compensation_requested(
    r: CallReserved, version: int, *, t: float = 50
) -> CompensationRequested:
    e = CompensationRequested(
        **_common(r, t),
        operator="alice",
        reason="customer asked",
        expected_version=version,
    )
    return sign(e, SIGNING_KEY)


def run_started(run_id: str = "r1", *, tenant: str = "acme", t: float = 0) -> RunStarted:
    return RunStarted(
        key=run_id, run_id=run_id, tenant_id=tenant, occurred_at=at(t), producer=PRODUCER
    )


def checkpointed(
    run_id: str, version: int, calls: tuple[str, ...], *, tenant: str = "acme", t: float = 0
) -> RunCheckpointed:
    return RunCheckpointed(
        key=run_id,
        run_id=run_id,
        tenant_id=tenant,
        occurred_at=at(t),
        producer=PRODUCER,
        expected_version=version,
        tool_call_ids=calls,
    )
