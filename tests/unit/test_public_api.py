"""The public surface is deliberate: a change to `toolledger.__all__` must be a decision."""

from __future__ import annotations

import toolledger
from toolledger.projections.verdicts import LedgerUnavailable

FROZEN = [
    "ConfigError",
    "KeyConflictError",
    "Ledger",
    "LedgerUnavailable",
    "OperatorSettings",
    "ProjectorSettings",
    "ReconcileOutcome",
    "RunQuarantined",
    "RunSuperseded",
    "Settings",
    "SideEffect",
    "SigningKey",
    "TenantMismatchError",
    "Tool",
    "ToolArgumentsError",
    "ToolCallAwaitingApproval",
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
    "Toolset",
    "VerifyKeys",
    "destructive",
    "external",
    "load_settings",
    "read",
    "write",
]


def test_the_export_list_is_frozen() -> None:
    """Adding or removing a public name must update this list in the same change."""
    assert sorted(toolledger.__all__) == FROZEN


def test_every_exported_name_exists() -> None:
    missing = [name for name in toolledger.__all__ if not hasattr(toolledger, name)]
    assert missing == []


def test_errors_raised_about_a_call_share_one_base() -> None:
    """Code that catches `ToolCallError` must catch every error about one call."""
    for name in (
        "KeyConflictError",
        "RunSuperseded",
        "ToolCallInProgress",
        "ToolCallIndeterminate",
        "ToolCallFailed",
        "ToolCallAwaitingApproval",
        "RunQuarantined",
        "TenantMismatchError",
        "ToolArgumentsError",
        "ToolResultUnreadable",
    ):
        assert issubclass(getattr(toolledger, name), toolledger.ToolCallError), name
    assert issubclass(toolledger.TenantMismatchError, PermissionError)
    assert toolledger.LedgerUnavailable is LedgerUnavailable
