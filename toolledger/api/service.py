"""The operator service: what a person may do to the ledger, shared by the HTTP API and the CLI.

Operators settle what nobody can know automatically (docs/architecture.md, "The decider"): they
resolve unknown calls, approve or reject calls that need approval, and ask for compensation.
Every decision follows the ledger's one command path: build the operator event from the record
the operator saw (`expected_version` = what they saw, or the current version), sign it with the
first configured key (`toolledger.events.lifecycle.sign`; the projector verifies with all of
them), append it and await the durable verdict. The decider's compare-and-set is the only
arbiter, so of two operators acting at once exactly one wins and the other is told what the
record is now. A rejected decision is still in the key's history, as evidence of who tried.

Visibility is by tenant: an `Operator` with a tenant sees only that tenant's calls, and another
tenant's key is "not found", never "forbidden" (which would confirm it exists). The API always
takes the tenant from the token; only admin tools with database access act across tenants.

Compensation (guarantee 7) is the one decision with a second step: after `compensation_requested`
is accepted, a `Compensator` runs the tool's compensation as its own ledgered call
`<key>:compensate`, and the service settles the original call from that call's outcome
(`call_compensated`, or `compensation_failed`, which puts it back to `completed`). An unknown
compensation leaves the original `compensating`; resolving `<key>:compensate` settles it, and
asking again for a `compensating` call finishes whatever an interrupted request left undone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from toolledger.api import metrics
from toolledger.api.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    OperatorError,
    Unavailable,
)
from toolledger.api.inputs import clean_reason, decode_cursor, encode_cursor, storable, value_json
from toolledger.errors import ConfigError, LedgerUnavailable
from toolledger.events.fold import HistoryEntry
from toolledger.events.lifecycle import lapsed_before, open_until
from toolledger.events.models import (
    CallApproved,
    CallCompensated,
    CallEvent,
    CallRejected,
    CallResolved,
    CompensationFailed,
    CompensationRequested,
    OperatorEvent,
    utcnow,
)
from toolledger.events.payloads import PayloadError
from toolledger.events.records import CallRecord, CallStatus, RunRecord, Verdict
from toolledger.events.signing import SigningKey, sign
from toolledger.port import CallQuery
from toolledger.projections.store import LedgerStore, StatusCounts

COMPENSATE_SUFFIX = ":compensate"
MAX_PAGE = 500
#: An operator's decision on a call that awaits approval.
Approval = Literal["approve", "reject"]

_Op = TypeVar("_Op", bound=OperatorEvent)


def compensation_key(key: str) -> str:
    """The key of the call that compensates `key` (guarantee 7: `<key>:compensate`)."""
    return key + COMPENSATE_SUFFIX


def resolvable_after(record: CallRecord) -> datetime | None:
    """When a `started` call may be settled by an operator (its deadline plus clock-skew grace)."""
    return open_until(record) if record.status == "started" else None


@dataclass(frozen=True)
class Operator:
    """Who acts: the tenant they may see (None: every tenant, for admin tools) and their id."""

    tenant_id: str | None
    operator: str


@dataclass(frozen=True)
class Page:
    """One page of calls and the cursor of the next (None on the last page)."""

    items: list[CallRecord]
    next_cursor: str | None


@dataclass(frozen=True)
class Compensation:
    """The compensated call as it is now, and the compensation call's record (if it exists)."""

    record: CallRecord
    compensation: CallRecord | None


class OperatorPort(Protocol):
    """What the operator service appends through: signed decisions in, durable verdicts out,
    payloads by reference both ways. `toolledger.wiring.commands.LedgerCommands` is the
    adapter over a stack (memory, or Kafka and PostgreSQL); the service knows only this."""

    async def offload(self, event: _Op) -> _Op:
        """`event` with its large payloads by reference, their blobs stored durably first."""

    async def append_and_await(self, event: CallEvent, timeout: float) -> Verdict:
        """Append `event` and return its verdict; `LedgerUnavailable` if none in `timeout`."""

    async def restored_call(self, call: CallRecord) -> CallRecord:
        """The record with its referenced arguments and result back in place."""

    async def restored_entry(self, entry: HistoryEntry) -> HistoryEntry:
        """A history entry whose event shows its referenced payloads."""

    async def restored_verdict(self, verdict: Verdict) -> Verdict:
        """The verdict with its call's payloads back in place."""


class Compensator(Protocol):
    """Runs a tool's compensation as its own ledgered call `<key>:compensate`.

    `toolledger.api.compensation.RuntimeCompensator` implements it with the runtime's executor.
    """

    def unavailable(self, record: CallRecord) -> str | None:
        """Why the compensation of `record`'s tool cannot run here (None when it can)."""

    async def run(self, record: CallRecord, known: CallRecord | None = None) -> CallRecord:
        """Reserve and run the compensation of `record` once; return the ledger's record of
        `<key>:compensate` afterwards (or as another holder left it, if it was not ours to run).
        `known`: that key's record as the caller just read it (None: it has none)."""


_REFUSED_AS_NOT_FOUND = frozenset({"unknown_call", "tenant_mismatch"})
_REFUSED_AS_MISCONFIGURED = frozenset({"unsigned", "bad_signature"})


class OperatorService:
    """Lists, shows and decides calls for one ledger; used by the API routes and the CLI."""

    def __init__(
        self,
        store: LedgerStore,
        commands: OperatorPort,
        *,
        signing_keys: Sequence[SigningKey],
        verdict_timeout: float = 10.0,
        compensator: Compensator | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if not signing_keys:
            raise ConfigError(
                "TOOLLEDGER_SIGNING_KEYS must name a private key (key_id:base64url): operator "
                "decisions are signed with the first, and projectors reject unsigned ones"
            )
        self.store = store
        self.commands = commands
        self._signer = signing_keys[0]
        self.key_id = self._signer.key_id
        self._sign_failure: str | None = None
        self._key_registered = False
        self.verdict_timeout = verdict_timeout
        self.compensator = compensator
        self.clock = clock
        self._waiting: dict[uuid.UUID, float] = {}
        self._last_timeout: float | None = None
        self._last_verdict: float | None = None
        self._running: set[asyncio.Task[Any]] = set()

    # -- reading -----------------------------------------------------------------------------

    async def list_calls(
        self,
        who: Operator,
        *,
        statuses: frozenset[CallStatus] = frozenset(),
        tool: str | None = None,
        run_id: str | None = None,
        contested: bool | None = None,
        limit: int = 50,
        cursor: str | None = None,
        overdue_only: bool = False,
    ) -> Page:
        """A page of the tenant's calls, longest-waiting first (oldest change first).

        `overdue_only` drops the `started` calls an operator may not resolve yet (still
        within their deadline plus grace): the console's queue of what needs a person.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest("invalid_limit", f"limit must be 1 to {MAX_PAGE}, not {limit}")
        if not all(storable(text) for text in (tool or "", run_id or "")):
            raise InvalidRequest("invalid_filter", "tool and run_id must be text without NUL")
        query = CallQuery(
            tenant_id=who.tenant_id,
            statuses=statuses,
            tool=tool,
            run_id=run_id,
            contested=contested,
            after=decode_cursor(cursor) if cursor else None,
            limit=limit + 1,
            started_deadline_before=lapsed_before(self.clock()) if overdue_only else None,
        )
        found = await self.store.list_calls(query)
        items = [await self.commands.restored_call(c) for c in found[:limit]]
        more = len(found) > limit
        return Page(items=items, next_cursor=encode_cursor(items[-1]) if more else None)

    async def get(self, who: Operator, key: str) -> CallRecord:
        """The call `key` if this operator may see it; `NotFound` otherwise."""
        # A NUL cannot be in a stored key (PostgreSQL text refuses it), so do not ask.
        record = await self.store.get_call(key) if storable(key) else None
        if record is None or who.tenant_id not in (None, record.tenant_id):
            # Where to list them is each surface's to say (HTTP: GET, the CLI: its command).
            where = "any tenant" if who.tenant_id is None else f"tenant {who.tenant_id}"
            raise NotFound("not_found", f"no tool execution {key!r} in {where}")
        return await self.commands.restored_call(record)

    async def counts(self, who: Operator) -> StatusCounts:
        """The tenant's calls per status, and how many `started` ones an operator may resolve."""
        return await self.store.status_counts(who.tenant_id, lapsed_before(self.clock()))

    async def run(self, who: Operator, run_id: str) -> RunRecord | None:
        """The run `run_id` if this operator's tenant owns it (None otherwise, or if unknown)."""
        run = await self.store.get_run(run_id) if storable(run_id) else None
        return run if run is not None and who.tenant_id in (None, run.tenant_id) else None

    async def show(self, who: Operator, key: str) -> tuple[CallRecord, list[HistoryEntry]]:
        """The call and every event of its key, accepted or rejected, in log order. Payloads
        stored by reference are restored in both (each entry's chain hash is the stored one,
        over the event as logged, digests and all)."""
        record = await self.get(who, key)
        history = await self.store.history(key)
        return record, [await self.commands.restored_entry(entry) for entry in history]

    # -- deciding ----------------------------------------------------------------------------

    async def resolve(
        self,
        who: Operator,
        key: str,
        *,
        outcome: Literal["completed", "failed"],
        reason: str,
        value: Any = None,
        result_reference: str | None = None,
        expected_version: int | None = None,
    ) -> CallRecord:
        """Settle an unknown (or overdue started) call as `completed` or `failed`.

        Resolving a compensation call (`<key>:compensate`) also settles the call it compensates.
        """
        reason = clean_reason(reason)
        if outcome == "failed" and (value is not None or result_reference is not None):
            raise InvalidRequest(
                "value_without_completion",
                "value and result_reference describe the effect of a completed call; a call "
                "resolved failed had no effect",
            )
        if result_reference is not None and not storable(result_reference):
            raise InvalidRequest(
                "invalid_reference", "result_reference must be UTF-8 text without NUL characters"
            )
        stored_value = value_json(value)
        record = await self.get(who, key)
        decision = CallResolved(
            **self._envelope(record),
            operator=who.operator,
            reason=reason,
            expected_version=self._expected(record, expected_version),
            outcome=outcome,
            value_json=stored_value,
            result_reference=result_reference,
        )
        try:
            # Before signing: the signature covers the value's digest, not its text.
            decision = await self.commands.offload(decision)
        except PayloadError as exc:
            raise InvalidRequest("payload_too_large", str(exc)) from exc
        event = self._signed(decision)
        settled = await self._decide(event)
        if key.endswith(COMPENSATE_SUFFIX):
            original = await self.store.get_call(key.removesuffix(COMPENSATE_SUFFIX))
            if original is not None and original.status == "compensating":
                await self._settle_compensated(original, settled)
        return settled

    async def decide_approval(
        self,
        decision: Approval,
        who: Operator,
        key: str,
        *,
        reason: str,
        expected_version: int | None = None,
    ) -> CallRecord:
        """Let a call that awaits approval run (`approve`: its driver then reserves it again),
        or refuse it (`reject`: it becomes failed, not attempted)."""
        reason = clean_reason(reason)
        record = await self.get(who, key)
        kind = CallApproved if decision == "approve" else CallRejected
        event = kind(
            **self._envelope(record),
            operator=who.operator,
            reason=reason,
            expected_version=self._expected(record, expected_version),
        )
        return await self._decide(self._signed(event))

    async def compensate(self, who: Operator, key: str, *, reason: str) -> Compensation:
        """Undo a completed call by running its tool's compensation once, as `<key>:compensate`.

        A `compensating` call (an earlier request was interrupted, or its compensation was
        unknown and has been resolved since) is finished from what the ledger holds; nothing
        that already ran is run again.
        """
        reason = clean_reason(reason)
        record = await self.get(who, key)
        if record.status in ("completed", "compensating"):
            self._require_compensator(record)
        if record.status == "compensating":
            return await self._finish(record, fresh=False)
        event = CompensationRequested(
            **self._envelope(record),
            operator=who.operator,
            reason=reason,
            expected_version=record.version,
        )
        requested = await self._decide(self._signed(event))
        return await self._finish(requested, fresh=True)

    # -- health ------------------------------------------------------------------------------

    def verdict_lag(self) -> float:
        """Seconds the oldest command of this process has been waiting for its verdict."""
        if not self._waiting:
            return 0.0
        return time.monotonic() - min(self._waiting.values())

    def verdicts_stalled(self) -> bool:
        """Whether the last command that ended got no verdict in time (and none came since)."""
        if self._last_timeout is None:
            return False
        return self._last_verdict is None or self._last_verdict < self._last_timeout

    # -- internals ---------------------------------------------------------------------------

    def _require_compensator(self, record: CallRecord) -> Compensator:
        compensator = self.compensator
        problem = (
            "this process has no tool registry, so it cannot run compensations; pass "
            "--tools <module declaring your toolsets> to `toolledger api` or to "
            "`toolledger executions compensate`"
            if compensator is None
            else compensator.unavailable(record)
        )
        if problem is not None or compensator is None:
            raise Conflict("compensation_unavailable", f"{record.key}: {problem}", record)
        return compensator

    async def _finish(self, original: CallRecord, *, fresh: bool) -> Compensation:
        """Run the compensation unless the ledger already holds it, then settle `original`.

        Shielded: an operator whose HTTP request is cut off must not cancel a compensation
        that may already have been sent; it runs to its outcome and is recorded.
        """
        task = asyncio.ensure_future(self._compensation(original, fresh=fresh))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)

    async def _compensation(self, original: CallRecord, *, fresh: bool) -> Compensation:
        compensator = self._require_compensator(original)
        done = await self.store.get_call(compensation_key(original.key))
        if done is None or (fresh and done.status == "failed"):
            done = await compensator.run(original, done)
        return await self._settle_compensated(original, done)

    async def _settle_compensated(self, original: CallRecord, done: CallRecord) -> Compensation:
        """Record on `original` what its compensation call `done` came to, if it is settled."""
        envelope = self._envelope(original)
        event: CallEvent
        match done.status:
            case "completed":
                # A result stored by reference stays on the compensation call's own record;
                # copying its text here could make this event too large to append.
                copied = "null" if done.result_blob is not None else done.result_json or "null"
                event = CallCompensated(**envelope, compensation_key=done.key, result_json=copied)
            case "failed":
                event = CompensationFailed(
                    **envelope, compensation_key=done.key, error=done.error or "it failed"
                )
            case _:
                return Compensation(
                    record=original, compensation=await self.commands.restored_call(done)
                )
        verdict = await self._command(event)
        # Rejected only when a concurrent request settled it first: report the truth.
        now = verdict.call if verdict.call is not None else original
        return Compensation(
            record=await self.commands.restored_call(now),
            compensation=await self.commands.restored_call(done),
        )

    def _envelope(self, record: CallRecord) -> dict[str, Any]:
        return {
            "key": record.key,
            "run_id": record.run_id,
            "tool_call_id": record.tool_call_id,
            "tenant_id": record.tenant_id,
            "occurred_at": self.clock(),
        }

    @staticmethod
    def _expected(record: CallRecord, given: int | None) -> int:
        return record.version if given is None else given

    def _signed(self, event: _Op) -> _Op:
        try:
            return sign(event, self._signer)
        except Exception as exc:  # a key the crypto library refuses: nothing was appended
            self._sign_failure = f"signing with key id {self.key_id!r} failed ({exc})"
            raise Unavailable(
                "cannot_sign",
                f"{event.type} for {event.key} was not appended: {self._sign_failure}. Check "
                "TOOLLEDGER_SIGNING_KEYS",
            ) from exc

    async def signing_problem(self) -> str | None:
        """Why this service cannot sign decisions the ledger would accept now (None: it can).

        Its key id must be among the keys this ledger's projectors registered, with the same
        public key: a decision signed with a key id no projector knows would halt its partition
        ("deploy keys before signers"), so it is refused before it is appended. A signature the
        ledger rejected is remembered until a decision is accepted again. `/readyz` reports it,
        and every decision checks it first (503 when set).
        """
        if self._sign_failure is not None:
            return self._sign_failure
        if self._key_registered:
            return None
        registered = (await self.store.registered_keys()).raw.get(self.key_id)
        mine = self._signer.public_setting()
        if registered is None:
            return (
                f"no projector of this ledger verifies this API's key id {self.key_id!r} yet; "
                f"deploy keys before signers: add {mine} to every projector's "
                "TOOLLEDGER_VERIFY_KEYS and restart them"
            )
        if registered != self._signer.public_bytes():
            return (
                f"this ledger's projectors verify key id {self.key_id!r} with another public key "
                f"than this API's TOOLLEDGER_SIGNING_KEYS ({mine}); a key id names one key "
                "forever: sign with a new key id"
            )
        self._key_registered = True  # registered keys are kept forever
        return None

    async def _decide(self, event: OperatorEvent) -> CallRecord:
        """Append a signed decision; the new record, or the error that says why not."""
        problem = await self.signing_problem()
        if problem is not None:
            raise Unavailable(
                "cannot_sign", f"{event.type} for {event.key} was not appended: {problem}"
            )
        verdict = await self._command(event)
        if verdict.accepted and verdict.call is not None:
            self._sign_failure = None
            return verdict.call
        raise self._refusal(verdict)

    async def _command(self, event: CallEvent) -> Verdict:
        started = time.monotonic()
        self._waiting[event.event_id] = started
        try:
            verdict = await self.commands.append_and_await(event, self.verdict_timeout)
        except LedgerUnavailable as exc:
            self._last_timeout = time.monotonic()
            metrics.COMMANDS.labels(event.type, "unavailable").inc()
            raise Unavailable(
                "ledger_unavailable",
                f"{event.type} for {event.key} got no verdict within {self.verdict_timeout:g}s "
                f"({exc}). It may still be applied: read the call again before retrying.",
            ) from exc
        finally:
            self._waiting.pop(event.event_id, None)
        self._last_verdict = time.monotonic()
        metrics.VERDICT_SECONDS.labels(event.type).observe(self._last_verdict - started)
        metrics.COMMANDS.labels(event.type, verdict.reason).inc()
        return await self.commands.restored_verdict(verdict)

    def _refusal(self, verdict: Verdict) -> OperatorError:
        if verdict.reason in _REFUSED_AS_NOT_FOUND:
            return NotFound("not_found", verdict.detail)
        if verdict.reason in _REFUSED_AS_MISCONFIGURED:
            self._sign_failure = (
                f"the ledger rejected this API's signature ({verdict.detail}); the API signs "
                f"with key id {self.key_id!r}: its public key in the projectors' "
                "TOOLLEDGER_VERIFY_KEYS must be the one of this TOOLLEDGER_SIGNING_KEYS"
            )
            return Unavailable("signing_key_rejected", self._sign_failure)
        record = verdict.call
        after = None
        if verdict.reason == "before_deadline" and record is not None:
            after = open_until(record)
        return Conflict(verdict.reason, verdict.detail, record, after)
