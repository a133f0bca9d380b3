"""toolledger: make an AI agent's tool calls take effect once, and say so when it cannot know.

This is the public surface; `tests/unit/test_public_api.py` freezes it. Everything else is an
implementation detail that may move: import from here.

```
billing = Toolset("billing")

@billing.tool(external(), reconcile=find_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    return await client.credit(account_id, amount_cents, idempotency_key=context.idempotency_key)

async with await Ledger.memory() as ledger:
    outcome = await ledger.call(
        issue_credit, run_id="r1", tool_call_id="c1", tenant_id="acme",
        arguments={"account_id": "a-7", "amount_cents": 2500},
    )
    credit = outcome.result()
```
"""

from toolledger.runtime.context import ToolContext
from toolledger.runtime.effects import SideEffect, destructive, external, read, write
from toolledger.runtime.errors import (
    KeyConflictError,
    LedgerUnavailable,
    RunQuarantined,
    RunSuperseded,
    TenantMismatchError,
    ToolArgumentsError,
    ToolArgumentsTooLarge,
    ToolCallAwaitingApproval,
    ToolCallContested,
    ToolCallError,
    ToolCallFailed,
    ToolCallIndeterminate,
    ToolCallInProgress,
    ToolFailedError,
    ToolNotAttemptedError,
    ToolResultUnreadable,
    ToolResultUnrecordable,
)
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.outcome import ToolOutcome
from toolledger.runtime.tools import ReconcileOutcome, Tool, ToolExecutionRecord, Toolset
from toolledger.settings import ConfigError, Settings, load_settings

__all__ = [
    "ConfigError",
    "KeyConflictError",
    "Ledger",
    "LedgerUnavailable",
    "ReconcileOutcome",
    "RunQuarantined",
    "RunSuperseded",
    "Settings",
    "SideEffect",
    "TenantMismatchError",
    "Tool",
    "ToolArgumentsError",
    "ToolArgumentsTooLarge",
    "ToolCallAwaitingApproval",
    "ToolCallContested",
    "ToolCallError",
    "ToolCallFailed",
    "ToolCallInProgress",
    "ToolCallIndeterminate",
    "ToolContext",
    "ToolExecutionRecord",
    "ToolFailedError",
    "ToolNotAttemptedError",
    "ToolOutcome",
    "ToolResultUnreadable",
    "ToolResultUnrecordable",
    "Toolset",
    "destructive",
    "external",
    "load_settings",
    "read",
    "write",
]
