"""The root of every error toolledger raises on purpose: `except ToolLedgerError` catches them all.

Each class carries a stable `code`, a short snake_case name that programs, logs and dashboards
can match on without parsing a message written for people; the message says what happened, to
which key or run, and what to do next. A few errors refine the code per instance with a reason
just as stable (the operator service's `version_mismatch` or `not_found`, an API token's
`token_expired`, a decoder's `unknown_fingerprint`); everywhere else the code is the class's.
The error classes live next to the code that raises them and are re-exported by `toolledger`;
this module has no imports of its own, so every layer can derive from it.

Where callers may already catch a builtin (a `ValueError` for bad arguments, a `PermissionError`
for another tenant's run, a `RuntimeError` from the dev stack), the class keeps that base too, so
existing `except` clauses stay correct.

`ExitStatus` is here, not with the CLI, because processes that supervise `toolledger` commands
(the drill, tests) read the statuses too; `toolledger.cli.entry` maps errors to them.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitStatus", "ToolLedgerError", "seconds"]


class ToolLedgerError(Exception):
    """Any error toolledger raises on purpose; `code` names its kind for programs."""

    code: str = "toolledger_error"


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
