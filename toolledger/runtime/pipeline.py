"""CallPipeline: the one road every ledgered call takes, composed once.

`Ledger.call`, `AgentRun`, every framework adapter (through `toolledger.runtime.policy`), the
MCP server and the operator's compensations all make their calls here; what differs between
them is a parameter, never a copy of the flow (docs/architecture.md, "The one road of a call"):

1. **Prepare**: validate the arguments against the tool's signature and fingerprint them
   (`args_digest`); arguments over the payload maximum are refused before anything is reserved.
2. **Read** the key's record once (the fast path), through read-your-writes: a `started`
   record this process already appended an outcome or abandon for is answered by that event's
   verdict. A caller that has read it already (the call-policy layer) hands the record in.
   A call that has not goes with its reservation (`read_or_reserve`, or `read_or_append` for
   a pipelined call of a run known bound to the caller): the port appends it only if the key
   has no record, which a partition leader answers in one round trip instead of two.
3. **Replay** (`toolledger.runtime.replay`): a completed key returns its recorded result,
   another digest is a `KeyConflictError`, a `started` or `indeterminate` key asks the reconcile
   hook. The fast path may skip a call, never decide to run one.
4. **Reserve**, in one of two modes:
   - *verdict first* (the default): append `reserved` and await its verdict before anything
     runs; no verdict in time abandons it (not attempted). A rejection is turned into the truth
     or an error (`replay.lost_reservation`);
   - *pipelined* (`external(pipelined=True)`, and only for a run known to be bound to the
     caller's tenant): run once Kafka acknowledged the reservation, and await its verdict while
     the tool runs, never giving up once it ran (`toolledger.runtime.pipelined` has the rules
     for a reservation refused after its tool ran).
5. **Execute** the tool (`toolledger.runtime.executor`: attempts, timeouts, classification).
6. **Record** the outcome (appended until it lands) and **answer**. With the runtime's
   `CallWaits` (`answer_on_ack`) an outcome appended inside the reservation's deadline returns
   on Kafka's acknowledgement: nobody else may settle the call before then, so the verdict can
   only agree. Otherwise the verdict is awaited, as the policy bounds it, and the answer is the
   ledger's truth (an operator's decision rather than this late result, if one came first).

Each step is a method of `CallProtocol` (`toolledger.runtime.protocol`); this module only
composes them, with the call's span (`toolledger.runtime.tracing`) around the whole road.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError

from toolledger.errors import LedgerUnavailable
from toolledger.events.models import CallIndeterminate, CallReserved, call_key
from toolledger.events.records import CallRecord, Verdict
from toolledger.port import NothingReserved
from toolledger.runtime import pipelined, replay
from toolledger.runtime.errors import (
    ToolArgumentsError,
    ToolArgumentsTooLarge,
    ToolCallAwaitingApproval,
    ToolResultUnrecordable,
    not_attempted,
)
from toolledger.runtime.executor import Attempted, CallIdentity, Indeterminate
from toolledger.runtime.outcome import ToolOutcome, own_outcome, settled_outcome, unsettled_error
from toolledger.runtime.protocol import CallProtocol, Landed
from toolledger.runtime.tools import PreparedCall, Tool
from toolledger.runtime.tracing import CallTrace, Phase

log = logging.getLogger("toolledger.runtime")

T = TypeVar("T")


class _Unread:
    """The type of `UNREAD`: the caller has not read the key yet."""

    __slots__ = ()


#: Passed as `record=` when the key has not been read: the pipeline reads it.
UNREAD: Final = _Unread()


def identity(tool: str, run_id: str, tool_call_id: str, tenant_id: str) -> CallIdentity:
    """The call's identity; `ValueError` naming the tool for an id that cannot make a key."""
    if not run_id or ":" in run_id or not tool_call_id or not tenant_id:
        raise ValueError(
            f"call {tool} needs a run_id without ':' and a non-empty tool_call_id and "
            f"tenant_id (got run_id={run_id!r}, tool_call_id={tool_call_id!r}, "
            f"tenant_id={tenant_id!r})"
        )
    return CallIdentity(run_id, tool_call_id, tenant_id, call_key(run_id, tool_call_id))


@dataclass(frozen=True, slots=True)
class _Call(Generic[T]):
    """One call on its way down the road: what every step after the replay needs."""

    tool: Tool[Any, T]
    traced: CallTrace
    prepared: PreparedCall
    who: CallIdentity
    run_version: int | None
    warning: str | None
    compensates: str | None


class CallPipeline:
    """The road of a call over `protocol` (its port and its `CallWaits`)."""

    def __init__(self, protocol: CallProtocol) -> None:
        self.protocol = protocol
        self.port = protocol.port
        #: Runs' tenant bindings and quarantines seen here (pipelined reservations need them).
        self.runs = pipelined.RunBindings()

    # -- the fast-path read -----------------------------------------------------------------

    async def read(self, key: str, *, within: float | None = None) -> CallRecord | None:
        """The key's record, reading this process's own writes (`own_write`)."""
        record = await self.port.read_call(key)
        if record is None:
            return None
        return await self.own_write(record, within=within)

    async def own_write(self, record: CallRecord, *, within: float | None = None) -> CallRecord:
        """Read-your-writes: a `started` record this process already appended an outcome or an
        abandon for (returned on acknowledgement, or landing in the background) is answered by
        that event's verdict: awaited as an outcome's is, or for at most `within` seconds, after
        which the record is answered as it was read."""
        own = self.protocol.own_writes
        event_id = own.get(record.key, record.reservation_id)
        if event_id is None or record.status != "started":
            return record
        if within is None:
            verdict = await self.protocol.await_outcome_verdict(record.key, event_id)
        else:
            try:
                verdict = await self.port.await_verdict(event_id, within)
            except LedgerUnavailable:
                return record  # not folded yet: the stored truth is `started`
        own.forget(record.key)
        return verdict.call or record

    # -- the road -----------------------------------------------------------------------------

    async def call(
        self,
        tool: Tool[Any, T],
        who: CallIdentity,
        arguments: Mapping[str, Any],
        *,
        run_version: int | None = None,
        warning: str | None = None,
        compensates: str | None = None,
        record: CallRecord | _Unread | None = UNREAD,
    ) -> ToolOutcome[T]:
        """Run `tool` once for `who`, or return what the ledger knows (the module docstring).

        `run_version`: the driver's checkpoint version (run fencing); `warning`: kept in the
        key's history with the reservation; `compensates`: the key this call compensates (an
        operator's call, exempt from fencing); `record`: the key's record if the caller read it.
        The call is an `execute_tool` span under the current one (docs/tracing.md).
        """
        with CallTrace(tool.name, tool.effect.kind, who.run_id, who.tool_call_id, who.key) as tr:
            prepared = self._prepare(tool, who, arguments)
            call = _Call(tool, tr, prepared, who, run_version, warning, compensates)
            if isinstance(record, _Unread) and not tr.recording:
                if not tool.effect.pipelined:
                    return tr.outcome(await self._read_or_reserve(call, pipelined=False))
                if self.runs.known_bound(who):
                    return tr.outcome(await self._read_or_reserve(call, pipelined=True))
            if isinstance(record, _Unread):
                record = await self.read(who.key)
            if record is not None:
                known = await replay.replay_known(self.protocol, tool, prepared, who, record)
                if known is not None:
                    return tr.outcome(known)
            if tool.effect.pipelined and await self.runs.bound_to_caller(self.port, tool.name, who):
                return tr.outcome(await self._pipelined(call))
            return tr.outcome(await self._verdict_first(call))

    def _prepare(
        self, tool: Tool[Any, Any], who: CallIdentity, arguments: Mapping[str, Any]
    ) -> PreparedCall:
        try:
            prepared = tool.prepare(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolArgumentsError(key=who.key, tool=tool.name, problems=problems) from None
        size, limit = len(prepared.arguments_json.encode()), self.port.limits.max_bytes
        if size > limit:
            raise ToolArgumentsTooLarge(key=who.key, tool=tool.name, size=size, limit=limit)
        return prepared

    def _reservation(self, call: _Call[Any], phase: Phase) -> CallReserved:
        """The call's reservation, carrying the reserve phase's trace context."""
        return self.protocol.reservation(
            call.tool,
            call.prepared,
            call.who,
            run_version=call.run_version,
            warning=call.warning,
            compensates=call.compensates,
            trace_context=phase.trace_context(),
        )

    async def _read_or_reserve(self, call: _Call[T], *, pipelined: bool) -> ToolOutcome[T]:
        """Steps 2 to 4 in one request: the reservation goes with the read of the key, and is
        appended only if the key has no record (`CallProtocol.read_or_reserve`, or for a
        pipelined call, whose run is known bound to the caller, `read_or_append_reservation`;
        one round trip to a partition leader instead of two). A key with a record is replayed
        as if read first; a replay that reserves again sends this same reservation, so a copy
        the leader may have appended is applied once. Only under a non-recording call span: a
        recording one gives the reservation its own phase's span, which a replay must not
        have."""
        protocol, tool, who = self.protocol, call.tool, call.who
        found: CallRecord | Verdict | None
        with call.traced.reserve() as phase:
            reserved = self._reservation(call, phase)
            try:
                if pipelined:
                    found = await protocol.read_or_append_reservation(reserved)
                else:
                    found = await protocol.read_or_reserve(reserved)
            except NothingReserved as exc:
                phase.unobserved()
                raise exc.error from exc.error.__cause__  # a failed read: nothing to abandon
            except LedgerUnavailable as exc:
                raise not_attempted(tool.name, who.key, exc) from exc
            if isinstance(found, CallRecord):
                phase.unobserved()
            elif found is not None:
                phase.verdict(found)
        if isinstance(found, CallRecord):
            record = await self.own_write(found)
            known = await replay.replay_known(protocol, tool, call.prepared, who, record)
            if known is not None:
                return known
            if pipelined:
                return await self._pipelined(call, reserved)
            return await self._verdict_first(call, reserved)
        if found is None:
            return await self._run_pipelined(call, reserved)
        return await self._reserved(call, reserved, found)

    async def _verdict_first(
        self, call: _Call[T], reserved: CallReserved | None = None
    ) -> ToolOutcome[T]:
        """Reserve and await the verdict, then run; `reserved`: the reservation to send (made
        here if None)."""
        protocol, tool, who, traced = self.protocol, call.tool, call.who, call.traced
        with traced.reserve() as phase:
            if reserved is None:
                reserved = self._reservation(call, phase)
            try:
                verdict = await protocol.reserve(reserved)
            except LedgerUnavailable as exc:
                raise not_attempted(tool.name, who.key, exc) from exc
            phase.verdict(verdict)
        return await self._reserved(call, reserved, verdict)

    async def _reserved(
        self, call: _Call[T], reserved: CallReserved, verdict: Verdict
    ) -> ToolOutcome[T]:
        """Go on from the verdict of `reserved`: run the tool if it was accepted."""
        protocol, tool, who, traced = self.protocol, call.tool, call.who, call.traced
        self.runs.learn(verdict.run)
        if not verdict.accepted:
            return await replay.lost_reservation(
                protocol, tool, call.prepared, who, verdict, call.run_version
            )
        if verdict.call is not None and verdict.call.status == "awaiting_approval":
            raise ToolCallAwaitingApproval(key=who.key, tool=tool.name, record=verdict.call)
        ended = await self._execute(call, reserved)
        with traced.outcome_phase():
            landed = await protocol.record(who, reserved, ended)
            return await self._answer(tool, who, reserved, ended, landed)

    async def _pipelined(
        self, call: _Call[T], reserved: CallReserved | None = None
    ) -> ToolOutcome[T]:
        """Append the reservation (made here if None), then run on its acknowledgement."""
        tool, who = call.tool, call.who
        with call.traced.reserve() as phase:
            if reserved is None:
                reserved = self._reservation(call, phase)
            try:
                await self.protocol.append_reservation(reserved, watch=True)
            except LedgerUnavailable as exc:
                raise not_attempted(tool.name, who.key, exc) from exc
        return await self._run_pipelined(call, reserved)

    async def _run_pipelined(self, call: _Call[T], reserved: CallReserved) -> ToolOutcome[T]:
        """Run the tool of an acknowledged reservation whose verdict is watched, and answer
        once that verdict and the outcome are in."""
        protocol, tool, who, traced = self.protocol, call.tool, call.who, call.traced
        try:
            ended = await self._execute(call, reserved)
        except BaseException:
            protocol.unwatch(reserved)
            raise
        with traced.outcome_phase() as phase:
            landing = protocol.recording(who, reserved, ended)  # lands while the verdict comes
            verdict = await protocol.await_verdict_after_running(reserved)
            phase.verdict(verdict)
            self.runs.learn(verdict.run)
            landed = await protocol.landed(who.key, landing)
            if verdict.accepted:
                return await self._answer(tool, who, reserved, ended, landed)
        # Refused: the outcome landed all the same, evidence in the key's history.
        return await pipelined.refused(
            protocol, tool, call.prepared, who, verdict, call.run_version
        )

    async def _execute(self, call: _Call[Any], reserved: CallReserved) -> Attempted:
        """Run the tool of an accepted (or, pipelined, acknowledged) reservation."""
        with call.traced.tool() as phase:
            ended = await self.protocol.execute(call.tool, call.prepared, call.who, reserved)
            phase.ended(ended)
        call.traced.ran(ended)
        return ended

    async def _answer(
        self,
        tool: Tool[Any, T],
        who: CallIdentity,
        reserved: CallReserved,
        ended: Attempted,
        landed: Landed,
    ) -> ToolOutcome[T]:
        """The answer of an accepted reservation whose outcome landed."""
        protocol = self.protocol
        if landed.unrecordable is not None:
            assert isinstance(landed.event, CallIndeterminate)
            return await self._unrecorded(tool, landed.event, landed.unrecordable)
        event = landed.event
        in_time = protocol.clock() < reserved.deadline
        if protocol.policy.answer_on_ack and not isinstance(ended, Indeterminate) and in_time:
            # Inside the deadline nobody else may settle the call: the verdict can only agree.
            protocol.own_writes.remember(who.key, reserved.reservation_id, event.event_id)
            return own_outcome(tool, who.key, ended)
        verdict = await protocol.await_outcome_verdict(who.key, event.event_id)
        truth = verdict.call
        if truth is None:
            raise AssertionError(f"the verdict on the outcome of {who.key} carries no record")
        if verdict.accepted and not isinstance(ended, Indeterminate):
            return replace(own_outcome(tool, who.key, ended), record=truth)
        if not verdict.accepted:
            log.warning(
                "outcome of %s was not applied (%s: %s); returning the ledger's truth",
                who.key,
                verdict.reason,
                verdict.detail,
            )
        outcome = settled_outcome(tool, truth, replayed=False)
        if outcome is None:
            raise unsettled_error(tool.name, truth)
        return outcome

    async def _unrecorded(
        self, tool: Tool[Any, T], fallback: CallIndeterminate, why: str
    ) -> ToolOutcome[T]:
        """The answer when the tool's outcome could not be recorded: the ledger's truth, which
        is the `indeterminate` put in its place unless someone settled the call meanwhile."""
        verdict = await self.protocol.await_outcome_verdict(fallback.key, fallback.event_id)
        truth = verdict.call
        if truth is None:
            raise AssertionError(f"the verdict on the outcome of {fallback.key} has no record")
        if truth.status == "indeterminate":
            raise ToolResultUnrecordable(truth, tool=tool.name, why=why)
        outcome = settled_outcome(tool, truth, replayed=False)
        if outcome is None:
            raise unsettled_error(tool.name, truth)
        return outcome
