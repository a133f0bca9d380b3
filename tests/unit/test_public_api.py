"""The public surface is deliberate: a change to `toolledger.__all__` must be a decision."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import toolledger
from toolledger.api.errors import Conflict, InvalidRequest, Misconfigured, NotFound, Unavailable
from toolledger.devstack import DevStackError
from toolledger.projections.verdicts import LedgerUnavailable

FROZEN = [
    "AgentConfig",
    "AgentConfigError",
    "AgentRun",
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


#: The other documented places (README, `toolledger/__init__.py`): module -> its frozen `__all__`.
DOCUMENTED_MODULES = {
    "toolledger.api": ["create_app"],
    "toolledger.testing": ["assert_tool_contract", "fake_tool_context"],
    "toolledger.subscribe": ["Fact", "FactFilter", "requests", "subscribe", "subscribe_group"],
}


def test_the_documented_modules_export_exactly_their_frozen_names() -> None:
    """The README sends users to these modules: their lists change only by decision."""
    for module_name, frozen in DOCUMENTED_MODULES.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == frozen, module_name
        assert [n for n in frozen if not hasattr(module, n)] == [], module_name


def _error_classes() -> list[type[BaseException]]:
    exported = [getattr(toolledger, name) for name in toolledger.__all__]
    errors = [c for c in exported if isinstance(c, type) and issubclass(c, BaseException)]
    return [*errors, NotFound, InvalidRequest, Conflict, Unavailable, Misconfigured]


def test_every_public_error_derives_from_the_one_root_with_a_code_of_its_own() -> None:
    """`except ToolLedgerError` must catch every error toolledger raises on purpose, and each
    class must keep a code a program can match on, distinct from every other class's."""
    errors = _error_classes()
    assert len(errors) >= 25
    codes: dict[str, str] = {}
    for cls in errors:
        assert issubclass(cls, toolledger.ToolLedgerError), cls.__name__
        code = cls.__dict__.get("code")
        assert isinstance(code, str) and re.fullmatch(r"[a-z_]+", code), cls.__name__
        assert code not in codes, f"{cls.__name__} and {codes[code]} share code {code}"
        codes[code] = cls.__name__


def test_errors_keep_the_builtin_bases_existing_except_clauses_rely_on() -> None:
    """Re-parenting under `ToolLedgerError` must not break `except ValueError` and friends."""
    assert issubclass(toolledger.ToolArgumentsError, ValueError)
    assert issubclass(toolledger.AgentConfigError, ValueError)
    assert issubclass(toolledger.TenantMismatchError, PermissionError)
    assert issubclass(DevStackError, RuntimeError)
    assert issubclass(DevStackError, toolledger.ToolLedgerError)


def test_the_operator_error_is_loaded_only_when_asked_for() -> None:
    """`import toolledger` must not import FastAPI for a runtime that never serves the API, and
    since the API's errors no longer live behind the app (issue 26: a runtime-only install has
    no FastAPI), neither must catching an operator error."""
    script = (
        "import sys, toolledger; assert 'fastapi' not in sys.modules, 'fastapi imported'; "
        "from toolledger import OperatorError; assert 'fastapi' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_run_wide_supersession_names_the_run_not_an_empty_call() -> None:
    """A driver refused for the whole run once read "call - (run r1, call )"."""
    message = str(toolledger.RunSuperseded.of_run("r1", "run_checkpointed was rejected"))
    assert message.startswith("run r1: run_checkpointed was rejected. This driver of run r1")
    assert "call" not in message.split(".")[0]
    per_call = toolledger.RunSuperseded(key="r1:c2", tool="billing.issue_credit", detail="x")
    assert str(per_call).startswith("call billing.issue_credit (run r1, call c2) was not made")
