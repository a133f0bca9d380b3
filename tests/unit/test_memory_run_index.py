"""The memory ledger answers a run's calls from its run index exactly as the reference scan."""

from __future__ import annotations

from tests import api_support as s
from toolledger.api.app import close_stack
from toolledger.port import CallQuery
from toolledger.projections.store import select_calls
from toolledger.wiring.stack import LedgerStack


async def test_a_runs_calls_from_the_index_match_a_scan_of_the_ledger() -> None:
    """`list_calls` by run must not miss or add a call, nor reorder them, against
    `select_calls` over every call (the duplicate-intent guards read it before each call)."""
    stack = await LedgerStack.memory(verify_keys=s.KEYS)
    try:
        calls = s.Calls(stack)
        for n in range(3):
            await calls.indeterminate(f"q-{n}", tenant="acme" if n % 2 else "globex")
            await calls.completed(f"q-{n}", "c2", tenant="acme" if n % 2 else "globex")
        await calls.reserve("q-1", "c3", tool="billing.send_email", tenant="acme")
        everything = list((await stack.store.snapshot()).calls.values())
        for query in [
            CallQuery(tenant_id="acme", run_id="q-1"),
            CallQuery(tenant_id="acme", run_id="q-1", tool="billing.send_email"),
            CallQuery(tenant_id=None, run_id="q-2", limit=1),
            CallQuery(tenant_id="acme", run_id="q-2"),
            CallQuery(tenant_id=None, run_id="nobody"),
        ]:
            assert await stack.store.list_calls(query) == select_calls(everything, query), query
        assert len(await stack.store.list_calls(CallQuery(tenant_id="acme", run_id="q-1"))) == 3
    finally:
        await close_stack(stack)
