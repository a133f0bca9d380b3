"""API tokens: shown once, stored hashed, scoped, expiring, revocable; and the listing cursor."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest

from toolledger.api.errors import InvalidRequest
from toolledger.api.inputs import decode_cursor, encode_cursor
from toolledger.api.tokens import MemoryTokens, TokenRejected, hash_token, role_allows
from toolledger.cli.tokens import parse_ttl
from toolledger.events.records import CallRecord

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


async def test_a_token_authenticates_until_it_expires_or_is_revoked() -> None:
    tokens = MemoryTokens()
    issued = await tokens.create("acme", "alice", "operator", timedelta(hours=1), now=NOW)
    assert issued.token.startswith("tlk_") and len(issued.token) > 40
    record = await tokens.authenticate(issued.token, now=NOW + timedelta(minutes=59))
    assert (record.tenant_id, record.operator, record.role) == ("acme", "alice", "operator")
    with pytest.raises(TokenRejected) as expired:
        await tokens.authenticate(issued.token, now=NOW + timedelta(hours=1))
    assert expired.value.code == "token_expired"
    revoked = await tokens.revoke(record.token_id, now=NOW)
    assert revoked is not None and revoked.revoked_at == NOW
    assert (await tokens.revoke(record.token_id, now=NOW + timedelta(1))) == revoked
    with pytest.raises(TokenRejected) as rejected:
        await tokens.authenticate(issued.token, now=NOW)
    assert rejected.value.code == "token_revoked"
    with pytest.raises(TokenRejected) as unknown:
        await tokens.authenticate(issued.token + "x", now=NOW)
    assert unknown.value.code == "invalid_token"
    assert await tokens.revoke("no-such-id") is None


async def test_only_the_hash_of_a_token_is_kept() -> None:
    """A leaked token table must not be usable as credentials."""
    tokens = MemoryTokens()
    issued = await tokens.create("acme", "alice", "viewer", timedelta(days=1))
    stored = repr(tokens.__dict__)
    assert issued.token not in stored
    assert hash_token(issued.token) in stored
    assert issued.record.token_id == hash_token(issued.token)[:16]
    listed = await tokens.list_tokens("acme")
    assert [r.token_id for r in listed] == [issued.record.token_id]
    assert await tokens.list_tokens("globex") == []


def test_roles_are_ordered_viewer_operator_admin() -> None:
    assert role_allows("admin", "operator") and role_allows("operator", "viewer")
    assert not role_allows("viewer", "operator")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90d", 90 * 86400), ("12h", 43200), ("30m", 1800), ("45", 45)]
)
def test_ttl_is_read_in_days_hours_minutes_or_seconds(text: str, seconds: int) -> None:
    assert parse_ttl(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["0", "-5m", "soon", "5w"])
def test_a_ttl_that_is_not_a_positive_duration_is_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_ttl(text)


def test_a_cursor_round_trips_and_a_forged_one_is_refused() -> None:
    record = CallRecord.model_validate(
        {
            "key": "r1:c1",
            "run_id": "r1",
            "tool_call_id": "c1",
            "tenant_id": "acme",
            "tool": "t",
            "effect": "write",
            "status": "indeterminate",
            "version": 2,
            "reservation_id": "5b0d6c1e-8a43-4c39-9a43-0c7a8e1f2d11",
            "args_digest": "d",
            "arguments_json": "{}",
            "requires_approval": False,
            "deadline": NOW,
            "created_at": NOW,
            "updated_at": NOW + timedelta(microseconds=7),
        }
    )
    assert decode_cursor(encode_cursor(record)) == (record.updated_at, "r1:c1")
    for forged in ("", "%%%", "WzEsMl0", "eyJhIjoxfQ"):
        with pytest.raises(InvalidRequest):
            decode_cursor(forged)
