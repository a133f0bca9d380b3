"""The public surface is deliberate: a change to `toolledger.__all__` must be a decision."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import toolledger
import toolledger.runtime
from toolledger.api.auth import ApiError
from toolledger.api.errors import Conflict, InvalidRequest, Misconfigured, NotFound, Unavailable
from toolledger.devstack import DevStackError
from toolledger.errors import LedgerUnavailable
from toolledger.integrations.mcp import KeyMetaError

FROZEN = [
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
    "toolledger.errors": [
        "CATALOGUE",
        "ExitStatus",
        "LedgerUnavailable",
        "ToolLedgerError",
        "seconds",
    ],
    "toolledger.wiring": ["connect_port", "memory_port", "port_over"],
    "toolledger.runtime": sorted(toolledger.runtime.__all__),
    "toolledger.integrations": [
        "AdapterOptions",
        "Answer",
        "CallKey",
        "Pause",
        "RunPauses",
        "RunStillPaused",
        "ToolNames",
        "call_key_for",
        "decode_run_id",
        "encode_run_id",
        "make_call",
        "model_tool_name",
    ],
    "toolledger.integrations.langgraph": ["LangGraphTools", "THREAD_ID_SOURCE"],
    "toolledger.integrations.openai_agents": ["OpenAIAgentsTools", "PausedRun", "RUN_ID_SOURCE"],
    "toolledger.integrations.pydantic_ai": ["CONVERSATION_SOURCE", "LedgerToolset", "PausedRun"],
    "toolledger.integrations.mcp": [
        "KeyMetaError",
        "LedgerMCPServer",
        "call_tool_keyed",
        "meta_for",
    ],
    "toolledger.testing": ["Operator", "assert_tool_contract", "fake_tool_context"],
    "toolledger.http.fake": [
        "Answer",
        "FakePayments",
        "MemoryBook",
        "Received",
        "RefundBook",
        "answer_json",
    ],
    "toolledger.subscribe": ["Fact", "FactFilter", "requests", "subscribe", "subscribe_group"],
}


RUNTIME_FROZEN = [
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


def test_the_runtime_surface_the_integrations_stand_on_is_frozen() -> None:
    """The adapters import these names only (tests/unit/test_layers.py): a change here is a
    change to what every integration may rely on."""
    assert sorted(toolledger.runtime.__all__) == RUNTIME_FROZEN


def test_every_integration_module_declares_its_exports() -> None:
    """A module without `__all__` exports whatever it imported: its surface is an accident."""
    import pkgutil

    import toolledger.integrations

    for info in pkgutil.iter_modules(toolledger.integrations.__path__):
        module = importlib.import_module(f"toolledger.integrations.{info.name}")
        assert isinstance(getattr(module, "__all__", None), list), info.name


def test_the_documented_modules_export_exactly_their_frozen_names() -> None:
    """The README sends users to these modules: their lists change only by decision."""
    for module_name, frozen in DOCUMENTED_MODULES.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == frozen, module_name
        assert [n for n in frozen if not hasattr(module, n)] == [], module_name


def _error_classes() -> list[type[BaseException]]:
    exported = [getattr(toolledger, name) for name in toolledger.__all__]
    errors = [c for c in exported if isinstance(c, type) and issubclass(c, BaseException)]
    return [
        *errors,
        NotFound,
        InvalidRequest,
        Conflict,
        Unavailable,
        Misconfigured,
        ApiError,
        KeyMetaError,
        DevStackError,
    ]


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


def test_the_api_and_the_operator_service_raise_one_family() -> None:
    """An `except OperatorError` around an operator action must also catch the API's own
    refusals (no token, the wrong role), which once derived from the root alone."""
    assert issubclass(ApiError, toolledger.OperatorError)
    assert issubclass(KeyMetaError, toolledger.ToolLedgerError)
    assert issubclass(KeyMetaError, ValueError)


def test_errors_keep_the_builtin_bases_existing_except_clauses_rely_on() -> None:
    """Re-parenting under `ToolLedgerError` must not break `except ValueError` and friends."""
    assert issubclass(toolledger.ToolArgumentsError, ValueError)
    assert issubclass(toolledger.AgentConfigError, ValueError)
    assert issubclass(toolledger.TenantMismatchError, PermissionError)
    assert issubclass(DevStackError, RuntimeError)
    assert issubclass(DevStackError, toolledger.ToolLedgerError)


def test_the_operator_error_is_loaded_only_when_asked_for() -> None:
    """`import toolledger` must not import FastAPI, aiokafka or asyncpg for a runtime that
    never serves the API; nor must `OperatorError`, a plain exception."""
    script = (
        "import sys, toolledger; heavy = ('fastapi', 'aiokafka', 'asyncpg'); "
        "assert not [h for h in heavy if h in sys.modules], 'imported at once'; "
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


def _every_error_class() -> set[type[BaseException]]:
    import pkgutil

    for info in pkgutil.walk_packages(toolledger.__path__, "toolledger."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)

    def under(cls: type[BaseException]) -> set[type[BaseException]]:
        found = set(cls.__subclasses__())
        for sub in list(found):
            found |= under(sub)
        return found

    return under(toolledger.ToolLedgerError)


def test_the_error_catalogue_lists_every_error_with_its_code() -> None:
    """`toolledger.errors` is the one place errors are looked up and imported from: a new
    error class that is not catalogued, or whose code another class already has, fails here."""
    from toolledger import errors

    found = {c for c in _every_error_class() if c.__module__ != "toolledger.errors"}
    listed = {name: (c.__module__, c.__dict__.get("code")) for c in found for name in [c.__name__]}
    assert listed == errors.CATALOGUE
    codes = [code for _, code in errors.CATALOGUE.values()]
    assert len(codes) == len(set(codes)), "two error classes share a code"
    for name in errors.CATALOGUE:
        assert getattr(errors, name).__name__ == name
