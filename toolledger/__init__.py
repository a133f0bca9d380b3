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

import importlib
from typing import TYPE_CHECKING, Any

from toolledger.errors import ToolLedgerError

if TYPE_CHECKING:
    from toolledger.api.errors import OperatorError
    from toolledger.errors import ConfigError, LedgerUnavailable
    from toolledger.events.codec import DecodeError
    from toolledger.events.log import LogError, LogIdentityError, TopicMissing
    from toolledger.events.records import CallRecord, RunRecord
    from toolledger.events.signing import SigningKey, VerifyKeys
    from toolledger.port import CallQuery
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
    from toolledger.runtime.runs import AgentRun, FinalAnswer, RunResult, ToolCallRequest
    from toolledger.runtime.tools import ReconcileOutcome, Tool, ToolExecutionRecord, Toolset
    from toolledger.settings import OperatorSettings, ProjectorSettings, Settings, load_settings

#: Where each public name lives. Loaded on first use (PEP 562), so `import toolledger` (which
#: every `toolledger` command does, `--help` included) costs nothing until a name is asked for:
#: the runtime's modules bring aiokafka and asyncpg with them, `OperatorError` FastAPI.
_MODULES: dict[str, tuple[str, ...]] = {
    "toolledger.events.codec": ("DecodeError",),
    "toolledger.events.log": ("LogError", "LogIdentityError", "TopicMissing"),
    "toolledger.events.records": ("CallRecord", "RunRecord"),
    "toolledger.events.signing": ("SigningKey", "VerifyKeys"),
    "toolledger.runtime.agents": (
        "AgentConfig",
        "AgentConfigError",
        "ToolPolicy",
        "load_agents",
        "parse_agents",
    ),
    "toolledger.runtime.context": ("ToolContext",),
    "toolledger.runtime.effects": (
        "PipeliningRefused",
        "SideEffect",
        "destructive",
        "external",
        "read",
        "write",
    ),
    "toolledger.runtime.errors": (
        "KeyConflictError",
        "RunQuarantined",
        "RunSuperseded",
        "TenantMismatchError",
        "ToolArgumentsError",
        "ToolArgumentsTooLarge",
        "ToolCallAwaitingApproval",
        "ToolCallContested",
        "ToolCallError",
        "ToolCallFailed",
        "ToolCallIndeterminate",
        "ToolCallInProgress",
        "ToolFailedError",
        "ToolNotAttemptedError",
        "ToolResultUnreadable",
        "ToolResultUnrecordable",
    ),
    "toolledger.runtime.ledger": ("Ledger",),
    "toolledger.runtime.outcome": ("ToolOutcome",),
    "toolledger.port": ("CallQuery",),
    "toolledger.runtime.runs": ("AgentRun", "FinalAnswer", "RunResult", "ToolCallRequest"),
    "toolledger.runtime.tools": ("ReconcileOutcome", "Tool", "ToolExecutionRecord", "Toolset"),
    "toolledger.errors": ("ConfigError", "LedgerUnavailable"),
    "toolledger.settings": (
        "OperatorSettings",
        "ProjectorSettings",
        "Settings",
        "load_settings",
    ),
    "toolledger.api.errors": ("OperatorError",),
}
_HOMES = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'toolledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
