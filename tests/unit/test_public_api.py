"""The public surface is deliberate: a change to `toolledger.__all__` must be a decision."""

from __future__ import annotations

import toolledger
from toolledger.projections.verdicts import LedgerUnavailable

FROZEN = [
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
        "ToolCallContested",
        "ToolResultUnrecordable",
        "ToolArgumentsTooLarge",
    ):
        assert issubclass(getattr(toolledger, name), toolledger.ToolCallError), name
    assert issubclass(toolledger.TenantMismatchError, PermissionError)
    assert toolledger.LedgerUnavailable is LedgerUnavailable
