"""The errors of the runtime, each written for the person who reads it in a log at 3 a.m.

Two raised *by tools*, to tell the runtime what happened:

- `ToolNotAttemptedError`: nothing left the building (a token expired, an account is locked).
  Recorded `failed` with `not_attempted=True`; calling again with the same tool_call_id runs it.
- `ToolFailedError`: the other system definitely said no. Recorded `failed`; no effect.

The rest are raised *by* `Ledger.call` about one call. Every message says what happened, to
which call (tool, run, call id), and what to do next, because the people who
read them are operators deciding whether a customer was charged. They all derive from
`ToolCallError`, which carries the key and the tool name for code that branches on them.
"""

from __future__ import annotations

import shlex
from datetime import datetime

from toolledger.errors import LedgerUnavailable, ToolLedgerError
from toolledger.events.records import CallRecord

__all__ = [
    "KeyConflictError",
    "LedgerUnavailable",
    "RunQuarantined",
    "RunSuperseded",
    "TenantMismatchError",
    "ToolArgumentsError",
    "ToolArgumentsTooLarge",
    "ToolCallAwaitingApproval",
    "ToolCallContested",
    "ToolCallError",
    "ToolCallFailed",
    "ToolCallInProgress",
    "ToolCallIndeterminate",
    "ToolFailedError",
    "ToolNotAttemptedError",
    "ToolResultUnreadable",
    "ToolResultUnrecordable",
]


class ToolNotAttemptedError(ToolLedgerError):
    """Raised by a tool that refused before any request left: safe to run again later."""

    code = "tool_not_attempted"


class ToolFailedError(ToolLedgerError):
    """Raised by a tool when the other system definitely refused: the call had no effect."""

    code = "tool_failed"


def call_label(tool: str, key: str) -> str:
    """`billing.issue_credit (run r1, call c7)`: how every message names a call."""
    run_id, _, tool_call_id = key.partition(":")
    return f"{tool} (run {run_id}, call {tool_call_id})"


def clause(text: object) -> str:
    """`text` ready to be followed by ". ": its own closing period, if any, dropped (a cause
    quoted inside a message must not leave "..")."""
    return str(text).rstrip().rstrip(".")


def not_attempted(tool: str, key: str, exc: Exception) -> LedgerUnavailable:
    """A call refused because its reservation was not acknowledged or decided in time."""
    return LedgerUnavailable(
        f"call {call_label(tool, key)} was not attempted: {clause(exc)}. Its reservation is being "
        "abandoned in the background; calling again with the same tool_call_id is safe once the "
        "ledger is reachable."
    )


def resolve_command(key: str) -> str:
    """The operator command that settles an unknown call (the key shell-quoted: a framework's
    tool_call_id may hold spaces, `#` or quotes)."""
    return (
        f"`toolledger executions resolve {shlex.quote(key)} --outcome completed|failed "
        "--reason ...`"
    )


class ToolCallError(ToolLedgerError):
    """An error about one call; `key` and `tool` name it for code that branches on it."""

    code = "tool_call_error"

    def __init__(self, message: str, *, key: str, tool: str) -> None:
        super().__init__(message)
        self.key = key
        self.tool = tool

    @property
    def run_id(self) -> str:
        return self.key.partition(":")[0]

    @property
    def tool_call_id(self) -> str:
        return self.key.partition(":")[2]


class ToolArgumentsError(ToolCallError, ValueError):
    """The arguments do not fit the tool's signature; nothing was reserved or run."""

    code = "invalid_arguments"

    def __init__(self, *, key: str, tool: str, problems: str) -> None:
        super().__init__(
            f"call {call_label(tool, key)} was not made: its arguments do not fit the tool's "
            f"signature ({problems}). Fix the arguments; nothing was reserved or run.",
            key=key,
            tool=tool,
        )


class ToolArgumentsTooLarge(ToolArgumentsError):
    """The arguments are larger than toolledger records; nothing was reserved or run."""

    code = "arguments_too_large"

    def __init__(self, *, key: str, tool: str, size: int, limit: int) -> None:
        ToolCallError.__init__(
            self,
            f"call {call_label(tool, key)} was not made: its arguments are {size} bytes, more "
            f"than the {limit} bytes toolledger records (TOOLLEDGER_PAYLOAD_MAX_BYTES). Pass a "
            "reference to the data (an id, a URL) instead of the data; nothing was reserved or "
            "run.",
            key=key,
            tool=tool,
        )
        self.size = size
        self.limit = limit


class KeyConflictError(ToolCallError):
    """The key was first used with other arguments; the tool did not run (`ran`: a pipelined
    tool did, before its reservation's verdict said so)."""

    code = "key_conflict"

    def __init__(
        self, *, key: str, tool: str, recorded: str, given: str, ran: bool = False
    ) -> None:
        what = (
            "ran before the ledger refused its reservation: another caller had reserved the key "
            f"first with other arguments (digest {recorded[:12]}, now {given[:12]}), so the "
            f"other system saw idempotency key {key} with both"
            if ran
            else f"was first made with other arguments (digest {recorded[:12]}, now "
            f"{given[:12]}); the tool did not run"
        )
        super().__init__(
            f"call {call_label(tool, key)} {what}. The same tool_call_id must always carry the "
            "same arguments: a new call needs a new tool_call_id.",
            key=key,
            tool=tool,
        )
        self.ran = ran


def _refused_after_running(tool: str, key: str) -> str:
    """How an error about a pipelined call that ran before its verdict names what happened."""
    return (
        f"call {call_label(tool, key)} ran before the ledger refused its reservation (its "
        "outcome is kept in the key's history as evidence)"
    )


class RunSuperseded(ToolCallError):
    """Another driver holds the run (or it ended): this one must stand down."""

    code = "run_superseded"

    def __init__(self, *, key: str, tool: str, detail: str, ran: bool = False) -> None:
        run_id, _, tool_call_id = key.partition(":")
        what = f"call {call_label(tool, key)} was not made" if tool_call_id else f"run {run_id}"
        then = ""
        if ran:
            what = _refused_after_running(tool, key)
            then = (
                f" The other system saw idempotency key {key}, so the driver that holds the run "
                "gets that same effect when it makes this call."
            )
        super().__init__(
            f"{what}: {detail}.{then} This driver of run {run_id} is superseded and must stand "
            "down; reload the run from its latest checkpoint if it should go on.",
            key=key,
            tool=tool,
        )
        self.ran = ran

    @classmethod
    def of_run(cls, run_id: str, detail: str) -> RunSuperseded:
        """About the whole run (a checkpoint or run event refused), not one of its calls."""
        return cls(key=run_id, tool="-", detail=detail)


class ToolCallInProgress(ToolCallError):
    """Someone else's reservation of the key is running and may still finish."""

    code = "call_in_progress"

    def __init__(self, *, key: str, tool: str, open_until: datetime) -> None:
        super().__init__(
            f"call {call_label(tool, key)} is running under another reservation and may still "
            f"finish until {open_until.isoformat()}; it was not run again. Call again later for "
            f"its outcome; after that time, an unsettled call can be resolved with "
            f"{resolve_command(key)}.",
            key=key,
            tool=tool,
        )


class ToolCallIndeterminate(ToolCallError):
    """Nobody knows whether the call took effect; it is never run again by itself."""

    code = "call_indeterminate"

    def __init__(self, record: CallRecord, *, tool: str | None = None) -> None:
        name = tool or record.tool
        why = record.error or "the process running it stopped before recording an outcome"
        super().__init__(
            f"call {call_label(name, record.key)} is indeterminate ({why}): nobody knows whether "
            "it took effect, so it will not be run again by itself. Look idempotency key "
            f"{record.key} up in the other system, then resolve it with "
            f"{resolve_command(record.key)}.",
            key=record.key,
            tool=name,
        )
        self.record = record


class ToolCallContested(ToolCallIndeterminate):
    """The call was settled, then evidence arrived that says otherwise; an operator decides.

    A `ToolCallIndeterminate` (nobody can say what happened without looking), so every handler
    of unknown calls (an `AgentRun` under `on_indeterminate: pause`) treats it the same way.
    """

    code = "call_contested"

    def __init__(self, record: CallRecord, *, tool: str | None = None) -> None:
        name = tool or record.tool
        who: str = record.settled_by or "nobody"
        if record.operator is not None and record.settled_by == "operator":
            who = f"operator {record.operator}"
        why = f" ({record.reason})" if record.reason else ""
        evidence = record.contested_evidence or "a late outcome contradicted it"
        ToolCallError.__init__(
            self,
            f"call {call_label(name, record.key)} is contested: {who} settled it "
            f"{record.status}{why}, but then {evidence}. It will not be run again until an "
            f"operator decides again: look idempotency key {record.key} up in the other system, "
            f"then resolve it with `toolledger executions resolve {record.key} --outcome "
            f"completed|failed --reason ... --expected-version {record.version}`.",
            key=record.key,
            tool=name,
        )
        self.record = record


class ToolResultUnrecordable(ToolCallIndeterminate):
    """The tool ran, and its outcome could not be recorded; the call is recorded indeterminate.

    A `ToolCallIndeterminate`: the effect may well have happened, so nothing runs it again, and
    an `AgentRun` under `on_indeterminate: pause` pauses on it like on any unknown call.
    """

    code = "result_unrecordable"

    def __init__(self, record: CallRecord, *, tool: str, why: str) -> None:
        ToolCallError.__init__(
            self,
            f"call {call_label(tool, record.key)} ran, but its outcome could not be recorded: "
            f"{why}. It is recorded indeterminate and will not run again by itself. Look "
            f"idempotency key {record.key} up in the other system, then resolve it with "
            f"{resolve_command(record.key)} (a completed resolution may carry a smaller value, "
            "or none).",
            key=record.key,
            tool=tool,
        )
        self.record = record
        self.why = why


class ToolCallFailed(ToolCallError):
    """Raised by `ToolOutcome.result()` for a call that is settled without a result."""

    code = "call_failed"

    def __init__(
        self,
        *,
        key: str,
        tool: str,
        error: str | None,
        not_attempted: bool,
        settled_by: str | None = None,
        record: CallRecord | None = None,
    ) -> None:
        if not_attempted:
            next_step = (
                "Nothing was sent, so calling it again with the same tool_call_id runs it again."
            )
        elif settled_by == "operator":
            next_step = "An operator settled it failed; it had no effect."
        else:
            next_step = "It had no effect; call it again only if the failure has been fixed."
        super().__init__(
            f"call {call_label(tool, key)} failed: {clause(error or 'no reason recorded')}. "
            f"{next_step}",
            key=key,
            tool=tool,
        )
        self.error = error
        self.not_attempted = not_attempted
        self.record = record


class ToolCallAwaitingApproval(ToolCallError):
    """The tool requires an operator's approval and has not run."""

    code = "awaiting_approval"

    def __init__(self, *, key: str, tool: str, record: CallRecord | None = None) -> None:
        super().__init__(
            f"call {call_label(tool, key)} needs an operator's approval and has not run. "
            "An operator approves or rejects it (`toolledger executions approve "
            f"{shlex.quote(key)} --reason ...`); then make the call again with the same "
            "tool_call_id.",
            key=key,
            tool=tool,
        )
        self.record = record


class RunQuarantined(ToolCallError):
    """The run's log holds a record nobody can read; its requests are refused until inspected."""

    code = "run_quarantined"

    def __init__(self, *, key: str, tool: str, detail: str, ran: bool = False) -> None:
        run_id = key.partition(":")[0]
        what = (
            _refused_after_running(tool, key)
            if ran
            else f"call {call_label(tool, key)} was not made"
        )
        super().__init__(
            f"{what}: run {run_id} is quarantined ({detail}). An operator must inspect "
            "`toolledger dead-letters list` before the run can go on.",
            key=key,
            tool=tool,
        )
        self.ran = ran


class TenantMismatchError(ToolCallError, PermissionError):
    """The run belongs to another tenant; nothing was reserved or run."""

    code = "tenant_mismatch"

    def __init__(self, *, key: str, tool: str, tenant_id: str) -> None:
        run_id = key.partition(":")[0]
        super().__init__(
            f"call {call_label(tool, key)} was refused: run {run_id} belongs to another tenant "
            f"than {tenant_id}. Use the tenant the run started with, or a new run_id.",
            key=key,
            tool=tool,
        )


class ToolResultUnreadable(ToolCallError):
    """A completed call's recorded result does not fit the tool's declared return type."""

    code = "result_unreadable"

    def __init__(self, *, key: str, tool: str, result_json: str, expected: str, why: str) -> None:
        shown = result_json if len(result_json) <= 80 else result_json[:77] + "..."
        super().__init__(
            f"call {call_label(tool, key)} completed, but its recorded result {shown} cannot be "
            f"read as {expected} ({why}). The effect stands; read outcome.record.result_json, "
            "or fix the declared return type.",
            key=key,
            tool=tool,
        )
