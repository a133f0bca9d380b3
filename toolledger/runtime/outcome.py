"""ToolOutcome: what `Ledger.call` returns, and how a ledger record becomes one.

An outcome is the ledger's truth about a call, in the caller's types: the recorded result
restored to the tool's declared return type, or why there is none. `replayed` says whether the
tool ran in *this* call (False) or the answer came from the ledger, a reconcile hook or an
operator (True), which is what a test of "one effect" and an auditor both want to see.

`result()` is the one-liner for code that wants the value or an exception: it returns the value
of a completed call and raises `ToolCallFailed` for anything settled without a usable result.
Unknown calls never become outcomes: `Ledger.call` raises `ToolCallIndeterminate` for them,
because an outcome object is too easy to treat as an answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, assert_never, cast

from pydantic import ValidationError

from toolledger.events.lifecycle import open_until
from toolledger.events.records import CallRecord, CallStatus, SettledBy
from toolledger.runtime.errors import (
    ToolCallAwaitingApproval,
    ToolCallContested,
    ToolCallError,
    ToolCallFailed,
    ToolCallIndeterminate,
    ToolCallInProgress,
    ToolResultUnreadable,
)
from toolledger.runtime.executor import Completed, Failed
from toolledger.runtime.tools import Tool

T = TypeVar("T")


@dataclass(frozen=True)
class ToolOutcome(Generic[T]):
    """The settled answer for one call key."""

    key: str
    tool: str
    status: CallStatus
    value: T | None = None
    error: str | None = None
    not_attempted: bool = False
    result_reference: str | None = None
    settled_by: SettledBy | None = None
    replayed: bool = False
    #: The ledger's record, when this answer was read from it (None when the call returned on
    #: Kafka's acknowledgement of its own outcome, before the projector folded it).
    record: CallRecord | None = None
    _unreadable: ToolResultUnreadable | None = field(default=None, repr=False, compare=False)

    @property
    def idempotency_key(self) -> str:
        return self.key

    @property
    def ok(self) -> bool:
        """True when the call completed and its result is readable."""
        return self.status == "completed" and self._unreadable is None

    def result(self) -> T:
        """The value of a completed call; `ToolCallFailed` (or a more precise error) otherwise."""
        match self.status:
            case "completed":
                if self._unreadable is not None:
                    raise self._unreadable
                return cast(T, self.value)
            case "failed":
                raise ToolCallFailed(
                    key=self.key,
                    tool=self.tool,
                    error=self.error,
                    not_attempted=self.not_attempted,
                    settled_by=self.settled_by,
                    record=self.record,
                )
            case "compensating" | "compensated":
                raise ToolCallFailed(
                    key=self.key,
                    tool=self.tool,
                    error=f"it completed, then an operator had its effect undone ({self.status})",
                    not_attempted=False,
                    settled_by="operator",
                    record=self.record,
                )
            case "indeterminate" | "awaiting_approval" | "started" | "approved":
                if self.record is None:
                    raise AssertionError(f"a {self.status} outcome always carries its record")
                raise unsettled_error(self.tool, self.record)
            case _:
                assert_never(self.status)


def own_outcome(tool: Tool[Any, T], key: str, ended: Completed | Failed) -> ToolOutcome[T]:
    """The outcome of a run of the tool in this call, as recorded by this runtime."""
    if isinstance(ended, Completed):
        return ToolOutcome(
            key=key, tool=tool.name, status="completed", value=ended.value, settled_by="runtime"
        )
    return ToolOutcome(
        key=key,
        tool=tool.name,
        status="failed",
        error=ended.error,
        not_attempted=ended.not_attempted,
        settled_by="runtime",
    )


def recorded_outcome(tool: Tool[Any, T], record: CallRecord, *, replayed: bool) -> ToolOutcome[T]:
    """The outcome a ledger record stands for, its result restored to the declared type."""
    value: T | None = None
    unreadable = None
    if record.status in ("completed", "compensating", "compensated"):
        text = record.result_json if record.result_json is not None else "null"
        try:
            value = tool.load_result(text)
        except ValidationError as exc:
            unreadable = ToolResultUnreadable(
                key=record.key,
                tool=tool.name,
                result_json=text,
                expected=tool.return_type_name,
                why=f"{exc.error_count()} validation error(s): {exc.errors()[0]['msg']}",
            )
    return ToolOutcome(
        key=record.key,
        tool=tool.name,
        status=record.status,
        value=value,
        error=record.error,
        not_attempted=record.not_attempted,
        result_reference=record.result_reference,
        settled_by=record.settled_by,
        replayed=replayed,
        record=record,
        _unreadable=unreadable,
    )


def settled_outcome(
    tool: Tool[Any, T], record: CallRecord, *, replayed: bool
) -> ToolOutcome[T] | None:
    """The outcome of a settled record; raises for an unknown or unapproved call and for a
    contested failed one; None while the call may still be running (`started`, `approved`)."""
    if record.contested and record.status == "failed":
        raise ToolCallContested(record, tool=tool.name)
    match record.status:
        case "completed" | "failed" | "compensating" | "compensated":
            return recorded_outcome(tool, record, replayed=replayed)
        case "indeterminate" | "awaiting_approval":
            raise unsettled_error(tool.name, record)
        case "started" | "approved":
            return None
        case _:
            assert_never(record.status)


def unsettled_error(tool: str, record: CallRecord) -> ToolCallError:
    """The error that says why a record holds no answer yet."""
    if record.status == "indeterminate":
        return ToolCallIndeterminate(record, tool=tool)
    if record.status == "awaiting_approval":
        return ToolCallAwaitingApproval(key=record.key, tool=tool, record=record)
    return ToolCallInProgress(key=record.key, tool=tool, open_until=open_until(record))
