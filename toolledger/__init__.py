"""toolledger: make an AI agent's tool calls take effect once, and say so when it cannot know.

Public means listed in an `__all__`: this module's, `toolledger.api`'s, `toolledger.testing`'s
or `toolledger.subscribe`'s; everything else may change in any release (the lists are frozen by
`tests/unit/test_public_api.py`).

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

Every error toolledger raises on purpose derives from `ToolLedgerError`, whose `code` is stable;
the operator service's subclasses of `OperatorError` live in `toolledger.api.errors`.
"""

from typing import TYPE_CHECKING, Any

from toolledger.errors import ToolLedgerError
from toolledger.events.codec import DecodeError
from toolledger.events.log import LogError, LogIdentityError, TopicMissing
from toolledger.events.records import CallRecord, RunRecord
from toolledger.events.signing import SigningKey, VerifyKeys
from toolledger.runtime.agents import (
    AgentConfig,
    AgentConfigError,
    ToolPolicy,
    load_agents,
    parse_agents,
)
from toolledger.runtime.context import ToolContext
from toolledger.runtime.effects import (
    PipeliningRefused,
    SideEffect,
    destructive,
    external,
    read,
    write,
)
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
from toolledger.runtime.port import CallQuery
from toolledger.runtime.runs import AgentRun, FinalAnswer, RunResult, ToolCallRequest
from toolledger.runtime.tools import ReconcileOutcome, Tool, ToolExecutionRecord, Toolset
from toolledger.settings import (
    ConfigError,
    OperatorSettings,
    ProjectorSettings,
    Settings,
    load_settings,
)

if TYPE_CHECKING:
    from toolledger.api.errors import OperatorError


def __getattr__(name: str) -> Any:
    # `OperatorError` lives under `toolledger.api`, whose package imports FastAPI: loaded only
    # when asked for, so `import toolledger` stays light for runtimes.
    if name == "OperatorError":
        from toolledger.api.errors import OperatorError

        return OperatorError
    raise AttributeError(f"module 'toolledger' has no attribute {name!r}")


__all__ = [
    "AgentConfig",
    "AgentConfigError",
    "AgentRun",
    "CallQuery",
    "CallRecord",
    "ConfigError",
    "DecodeError",
    "FinalAnswer",
    "KeyConflictError",
    "Ledger",
    "LedgerUnavailable",
    "LogError",
    "LogIdentityError",
    "OperatorError",
    "OperatorSettings",
    "PipeliningRefused",
    "ProjectorSettings",
    "ReconcileOutcome",
    "RunQuarantined",
    "RunRecord",
    "RunResult",
    "RunSuperseded",
    "Settings",
    "SideEffect",
    "SigningKey",
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
    "ToolCallRequest",
    "ToolContext",
    "ToolExecutionRecord",
    "ToolFailedError",
    "ToolLedgerError",
    "ToolNotAttemptedError",
    "ToolOutcome",
    "ToolPolicy",
    "ToolResultUnreadable",
    "ToolResultUnrecordable",
    "Toolset",
    "TopicMissing",
    "VerifyKeys",
    "destructive",
    "external",
    "load_agents",
    "load_settings",
    "parse_agents",
    "read",
    "write",
]
