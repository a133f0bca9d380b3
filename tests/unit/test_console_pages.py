"""What the console's pages compute from the ledger: attempts, the queue's filters, key URLs.

Over the embedded ledger with the runtime's own events, so the history these read is the one
the projector writes.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

from tests import api_support as s
from toolledger.api.app import close_stack
from toolledger.api.console.pages import attempts
from toolledger.api.console.web import call_url, dom_id, waited
from toolledger.api.service import Operator, OperatorService
from toolledger.events.models import CallFailed
from toolledger.events.records import CallStatus
from toolledger.wiring.stack import LedgerStack


@pytest.fixture
async def stack() -> AsyncIterator[LedgerStack]:
    stack = await LedgerStack.memory(verify_keys=s.KEYS)
    try:
        yield stack
    finally:
        await close_stack(stack)


async def _attempts(stack: LedgerStack, key: str) -> int:
    record = await stack.store.get_call(key)
    assert record is not None
    return attempts(record, await stack.store.history(key))


async def test_attempts_count_the_runs_of_the_tool_not_refusals_or_findings(
    stack: LedgerStack,
) -> None:
    """A refusal before anything was sent, a reconcile finding and an approval request are not
    runs of the tool; a rerun after a refusal is."""
    calls = s.Calls(stack)
    first = await calls.reserve("run-1")
    assert await _attempts(stack, first.key) == 1  # started: running now
    refused = CallFailed(
        key=first.key,
        run_id=first.run_id,
        tool_call_id=first.tool_call_id,
        tenant_id=first.tenant_id,
        reservation_id=first.reservation_id,
        error="the account is frozen",
        not_attempted=True,
    )
    await calls.apply(refused)
    assert await _attempts(stack, first.key) == 0
    again = await calls.reserve("run-1")
    await calls.apply(s.Calls.indeterminate_of(again))
    assert await _attempts(stack, first.key) == 1
    await calls.apply(s.Calls.completed_of(again, source="reconcile", expected_version=4))
    assert await _attempts(stack, first.key) == 1

    waiting = await calls.reserve("run-2", requires_approval=True)
    assert await _attempts(stack, waiting.key) == 0


async def test_the_queue_lists_overdue_started_calls_but_not_those_within_their_deadline(
    stack: LedgerStack,
) -> None:
    calls = s.Calls(stack)
    overdue = await calls.reserve("run-o", deadline_in=-60)
    await calls.reserve("run-i")
    unknown = await calls.indeterminate("run-u")
    service = OperatorService(stack.store, stack.commands, signing_keys=(s.SIGNING_KEY,))
    who = Operator(tenant_id="acme", operator="alice")
    statuses: frozenset[CallStatus] = frozenset({"indeterminate", "started", "awaiting_approval"})
    page = await service.list_calls(who, statuses=statuses, overdue_only=True)
    assert [c.key for c in page.items] == [overdue.key, unknown.key]
    counts = await service.counts(who)
    assert (counts.by_status, counts.overdue) == ({"started": 2, "indeterminate": 1}, 1)
    other = await service.counts(Operator(tenant_id="globex", operator="gus"))
    assert (other.by_status, other.overdue) == ({}, 0)


@pytest.mark.parametrize("key", ["r1:c7", "r1:toolu/01", "r1:a b#c?d=e&f=%2F", "r1:ünï/ø"])
def test_a_key_survives_its_url_and_its_element_id(key: str) -> None:
    url = urlsplit(call_url(key))
    assert url.path == "/console/call"
    assert parse_qs(url.query) == {"key": [key]}
    assert re.fullmatch(r"call-[0-9a-f]{16}", dom_id(key))


def test_waiting_times_read_like_a_queue() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert waited(now - timedelta(seconds=12), now) == "12 s"
    assert waited(now - timedelta(minutes=2, seconds=5), now) == "2 min 5 s"
    assert waited(now - timedelta(hours=3, minutes=4), now) == "3 h 4 min"
    assert waited(now - timedelta(days=2, hours=1), now) == "2 d 1 h"
    assert waited(now + timedelta(seconds=3), now) == "0 s"
