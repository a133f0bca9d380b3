"""The root of every error toolledger raises on purpose: `except ToolLedgerError` catches them all.

Each class carries a stable `code`, a short snake_case name that programs, logs and dashboards
can match on without parsing a message written for people; the message says what happened, to
which key or run, and what to do next. A few errors refine the code per instance with a reason
just as stable (the operator service's `version_mismatch` or `not_found`, an API token's
`token_expired`, a decoder's `unknown_fingerprint`); everywhere else the code is the class's.
The error classes live next to the code that raises them and are re-exported by `toolledger`;
this module imports no other toolledger module when it is imported, so every layer can derive
from it.

Where callers may already catch a builtin (a `ValueError` for bad arguments, a `PermissionError`
for another tenant's run, a `RuntimeError` from the dev stack), the class keeps that base too, so
existing `except` clauses stay correct.

Every error class is importable from here, `from toolledger.errors import ToolCallIndeterminate`,
whichever module defines it: `CATALOGUE` names each class's home and code (loaded on first use,
so importing this module still imports nothing), and tests/unit/test_public_api.py checks that
it lists every subclass of `ToolLedgerError` with the code the class carries, no code twice.

`ExitStatus` is here, not with the CLI, because processes that supervise `toolledger` commands
(the drill, tests) read the statuses too; `toolledger.cli.entry` maps errors to them.
"""

from __future__ import annotations

import importlib
from enum import IntEnum
from typing import Any

__all__ = ["CATALOGUE", "ExitStatus", "LedgerUnavailable", "ToolLedgerError", "seconds"]

#: Every error class toolledger defines outside this module: name -> (module, code).
CATALOGUE: dict[str, tuple[str, str]] = {
    "AgentConfigError": ("toolledger.runtime.agents", "agent_config"),
    "ApiError": ("toolledger.api.auth", "api_error"),
    "CommandFailed": ("toolledger.cli.entry", "command_failed"),
    "Conflict": ("toolledger.api.errors", "conflict"),
    "DecodeError": ("toolledger.events.codec", "undecodable"),
    "DevStackError": ("toolledger.dev.processes", "dev_stack"),
    "DevStackMissing": ("toolledger.dev.processes", "dev_stack_missing"),
    "FrameError": ("toolledger.leader.runtime_side.frames", "bad_frame"),
    "InvalidRequest": ("toolledger.api.errors", "invalid_request"),
    "KeyConflictError": ("toolledger.runtime.errors", "key_conflict"),
    "KeyMetaError": ("toolledger.integrations._mcp_keys", "key_meta"),
    "KeySetMismatch": ("toolledger.events.signing", "key_set_mismatch"),
    "LeaderBehind": ("toolledger.leader.projector_side.partition", "leader_behind"),
    "LeaderSuperseded": ("toolledger.leader.projector_side.partition", "leader_superseded"),
    "LogError": ("toolledger.events.log", "log_error"),
    "LogIdentityError": ("toolledger.events.log", "log_identity"),
    "Misconfigured": ("toolledger.api.errors", "misconfigured"),
    "MissingExtra": ("toolledger.extras", "missing_extra"),
    "ModuleLoadError": ("toolledger.modules", "module_load"),
    "NotFound": ("toolledger.api.errors", "not_found"),
    "NothingReserved": ("toolledger.port", "nothing_reserved"),
    "OffsetConflict": ("toolledger.projections.store", "offset_conflict"),
    "OperatorError": ("toolledger.api.errors", "operator_error"),
    "OutcomeVerdictPending": ("toolledger.runtime.protocol", "outcome_verdict_pending"),
    "PayloadError": ("toolledger.events.payloads", "payload_error"),
    "PayloadRefused": ("toolledger.events.payloads", "payload_refused"),
    "PayloadTooLarge": ("toolledger.events.payloads", "payload_too_large"),
    "PayloadUnavailable": ("toolledger.events.payloads", "payload_unavailable"),
    "PipeliningRefused": ("toolledger.runtime.effects", "pipelining_refused"),
    "RecordTooLarge": ("toolledger.events.log", "record_too_large"),
    "RefusedBeforeLookup": ("toolledger.runtime.resend", "refused_before_lookup"),
    "ReplayStopped": ("toolledger.projections.replay", "replay_stopped"),
    "ReplayTargetInUse": ("toolledger.projections.replay", "replay_target_in_use"),
    "RequestFailed": ("toolledger.http._errors", "http_request_failed"),
    "RequestInProgress": ("toolledger.http._errors", "http_request_in_progress"),
    "RequestNotSent": ("toolledger.http._errors", "http_request_not_sent"),
    "RequestOutcomeUnknown": ("toolledger.http._errors", "http_outcome_unknown"),
    "RequestRefused": ("toolledger.http._errors", "http_request_refused"),
    "ResendWindowPassed": ("toolledger.runtime.resend", "resend_window_passed"),
    "RunQuarantined": ("toolledger.runtime.errors", "run_quarantined"),
    "RunStillPaused": ("toolledger.integrations._runs", "run_still_paused"),
    "RunSuperseded": ("toolledger.runtime.errors", "run_superseded"),
    "StoreError": ("toolledger.projections.store", "store_error"),
    "TenantMismatchError": ("toolledger.runtime.errors", "tenant_mismatch"),
    "TokenRejected": ("toolledger.api.tokens", "token_rejected"),
    "ToolArgumentsError": ("toolledger.runtime.errors", "invalid_arguments"),
    "ToolArgumentsTooLarge": ("toolledger.runtime.errors", "arguments_too_large"),
    "ToolCallAwaitingApproval": ("toolledger.runtime.errors", "awaiting_approval"),
    "ToolCallContested": ("toolledger.runtime.errors", "call_contested"),
    "ToolCallError": ("toolledger.runtime.errors", "tool_call_error"),
    "ToolCallFailed": ("toolledger.runtime.errors", "call_failed"),
    "ToolCallInProgress": ("toolledger.runtime.errors", "call_in_progress"),
    "ToolCallIndeterminate": ("toolledger.runtime.errors", "call_indeterminate"),
    "ToolFailedError": ("toolledger.runtime.errors", "tool_failed"),
    "ToolNotAttemptedError": ("toolledger.runtime.errors", "tool_not_attempted"),
    "ToolResultUnreadable": ("toolledger.runtime.errors", "result_unreadable"),
    "ToolResultUnrecordable": ("toolledger.runtime.errors", "result_unrecordable"),
    "TopicMissing": ("toolledger.events.log", "topic_missing"),
    "Unavailable": ("toolledger.api.errors", "unavailable"),
    "UnknownSigningKey": ("toolledger.events.signing", "unknown_signing_key"),
}


class ToolLedgerError(Exception):
    """Any error toolledger raises on purpose; `code` names its kind for programs."""

    code: str = "toolledger_error"


class LedgerUnavailable(ToolLedgerError):
    """No verdict came in time: Kafka, the projector or PostgreSQL is down or behind.

    Raised before a tool runs, it means the call was not attempted.
    """

    code = "ledger_unavailable"


class ConfigError(ToolLedgerError):
    """A setting is missing or invalid; the message names the environment variable."""

    code = "config_error"


class ExitStatus(IntEnum):
    """The exit statuses of every `toolledger` command (docs/architecture.md, "Errors and exit
    statuses")."""

    OK = 0
    NO = 1
    USAGE = 2
    UNAVAILABLE = 3
    LOG_MISMATCH = 4
    STOPPED = 143


def seconds(value: float) -> str:
    """A duration for a message: `10s`, `2.5s`, never `9.99734s`."""
    return f"{value:.0f}s" if value >= 10 else f"{value:.2g}s"


def __getattr__(name: str) -> Any:
    """An error class of the catalogue, imported from its home on first use."""
    home = CATALOGUE.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home[0]), name)
