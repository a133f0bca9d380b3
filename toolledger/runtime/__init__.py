"""The runtime SDK: what an agent runtime imports to run tools through the ledger.

Modules, in the order a call meets them: `tools` (declarations), `effects` (retry rules),
`context` (what a tool receives), `ledger` (`Ledger.call`), `policy` (the call-policy layer
that `AgentRun` and the framework adapters share), `pipeline` (the one road of a call),
`replay` and `reconcile` (keys already in the ledger), `pipelined` (its reservation mode's
rules), `protocol` (the steps and how long each waits), `executor` (attempts and
classification), `recording` (outcome events, background appends), `outcome` (what the
caller gets), `errors`;
`runs` (the `AgentRun` driver), `pauses` (when a paused run may resume) and `framework_runs`
(the pauses of runs an agent framework drives, recorded for the adapters).
Everything the runtime reads and appends goes through `toolledger.port` (`RuntimePort`), a
floor below this package with nothing of storage under it.

The names below are the runtime's public surface: what the framework adapters
(`toolledger.integrations`) may rely on, and `toolledger` re-exports the ones applications
use; the list is frozen by tests/unit/test_public_api.py. Beyond them the adapters use one
internal seam, named in tests/unit/test_layers.py: the call-policy layer (`policy.drive_call`,
with `pipeline.identity` for the call it makes), which `AgentRun` shares.
"""

from toolledger.errors import LedgerUnavailable
from toolledger.events.records import CallRecord, RunRecord
from toolledger.port import CallQuery, RuntimePort
from toolledger.runtime.agents import AgentConfig, ToolPolicy
from toolledger.runtime.context import ToolContext
from toolledger.runtime.errors import (
    KeyConflictError,
    RunQuarantined,
    RunSuperseded,
    TenantMismatchError,
    ToolArgumentsError,
    ToolCallAwaitingApproval,
    ToolCallContested,
    ToolCallError,
    ToolCallIndeterminate,
    ToolCallInProgress,
    call_label,
    resolve_command,
)
from toolledger.runtime.framework_runs import FrameworkRuns
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.outcome import ToolOutcome
from toolledger.runtime.policy import (
    Heard,
    HeardHow,
    HeardStatus,
    Hold,
    HoldReason,
    OnUnknownOrRepeat,
)
from toolledger.runtime.tools import Tool, Toolset

__all__ = [
    "AgentConfig",
    "CallQuery",
    "CallRecord",
    "FrameworkRuns",
    "Heard",
    "HeardHow",
    "HeardStatus",
    "Hold",
    "HoldReason",
    "KeyConflictError",
    "Ledger",
    "LedgerUnavailable",
    "OnUnknownOrRepeat",
    "RunQuarantined",
    "RunRecord",
    "RunSuperseded",
    "RuntimePort",
    "TenantMismatchError",
    "Tool",
    "ToolArgumentsError",
    "ToolCallAwaitingApproval",
    "ToolCallContested",
    "ToolCallError",
    "ToolCallInProgress",
    "ToolCallIndeterminate",
    "ToolContext",
    "ToolOutcome",
    "ToolPolicy",
    "Toolset",
    "call_label",
    "resolve_command",
]
