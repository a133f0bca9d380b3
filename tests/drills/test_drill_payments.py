"""The drill's HTTP refund: its payments API as a process, its effects in billing, its checks.

The CI drill kills runtimes in the middle of HTTP refunds; what it can conclude rests on the
pieces shown here: the payments API is a process of its own that keeps every refund in the
drill's billing database (so the checks count them like any credit), replays a key's first
answer (so a resend is a lookup), refuses what is not a refund, and stops on SIGTERM; and the
check "no completed call ran twice" takes a resend's replay for the lookup it is, and nothing
else.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from pathlib import Path

import httpx

from tests.drills.evidence import call, entry, failed, healthy
from tests.integration.procs import until
from toolledger.drill.billing import DrillBilling, Effect
from toolledger.drill.checks import Evidence, judge
from toolledger.drill.payments import BillingBook
from toolledger.http.fake import FakePayments

TWICE = "no completed call ran twice"
REFUND = {"charge": "acct-r1", "amount": 101, "memo": "r1/s1"}


async def test_a_repeated_key_replays_the_first_refund_and_billing_counts_both_requests(
    tmp_path: Path,
) -> None:
    """A resend must find the first refund, byte for byte, and make none: billing holds one
    credit and counts the second request as a replay, the evidence the checks judge."""
    billing = DrillBilling(tmp_path / "billing.db")
    async with (
        FakePayments(book=BillingBook(billing)) as api,
        httpx.AsyncClient(base_url=api.url) as client,
    ):
        first = await client.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "r1:s1"})
        again = await client.post("/v1/refunds", json=REFUND, headers={"Idempotency-Key": "r1:s1"})
        bad = await client.post(
            "/v1/refunds", json={"amount": "lots"}, headers={"Idempotency-Key": "r1:s2"}
        )
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert bad.status_code == 400 and "charge" in bad.json()["error"]
    credit = first.json()
    assert billing.effects() == [Effect("r1:s1", credit["id"], "r1/s1")]
    assert billing.requests() == {"r1:s1": Counter(credited=1, replayed=1)}


async def test_the_payments_process_serves_from_its_address_file_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """The drill starts the API by pid and learns its URL from the file it writes once it
    listens; the refunds it made are in billing after it stopped."""
    address = tmp_path / "payments.url"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolledger.drill.payments",
        "--billing",
        str(tmp_path / "billing.db"),
        "--address-file",
        str(address),
    )
    try:
        await until(address.exists, timeout=30, what="the payments API's address")
        async with httpx.AsyncClient(base_url=address.read_text()) as client:
            answer = await client.post(
                "/v1/refunds", json=REFUND, headers={"Idempotency-Key": "r1:s1"}
            )
        assert answer.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert [e.key for e in DrillBilling(tmp_path / "billing.db").effects()] == ["r1:s1"]


def _refund_settled_by_resending(*, resent: bool) -> tuple[str, Evidence]:
    evidence = healthy()
    evidence.resent_tools = frozenset({"drill.refund"})
    refund = call("r1:s1", "completed", "cr_b", settled_by="reconcile" if resent else "runtime")
    evidence.snapshot.calls["r1:s1"] = refund.model_copy(update={"tool": "drill.refund"})
    if resent:
        evidence.snapshot.history.append(entry("r1:s1", 8, "reconcile_attempted", {}))
    evidence.requests = {**evidence.requests, "r1:s1": Counter(credited=1, replayed=2)}
    return "r1:s1", evidence


def test_a_resend_of_a_key_settled_by_resending_is_a_lookup_and_any_other_repeat_a_rerun() -> None:
    """Replays of a refund the ledger settled by resending are its lookups; the same replays of
    a call its runtime completed (never resent), or of a tool that does not declare resends,
    are a completed call reaching billing again, and a second credit is one either way."""
    _, evidence = _refund_settled_by_resending(resent=True)
    assert failed(evidence) == set()
    tally = judge(evidence)[1]
    assert (tally.resent, tally.lookups) == (1, 2)
    assert tally.effects_by_tool == {"drill.charge": 1, "drill.refund": 1}

    _, evidence = _refund_settled_by_resending(resent=False)
    assert failed(evidence) == {TWICE}

    _, evidence = _refund_settled_by_resending(resent=True)
    evidence.resent_tools = frozenset()
    assert failed(evidence) == {TWICE}

    key, evidence = _refund_settled_by_resending(resent=True)
    evidence.requests = {**evidence.requests, key: Counter(credited=2)}
    assert failed(evidence) == {TWICE}
