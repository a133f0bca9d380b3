"""`Ledger`: what an agent runtime calls to make a tool call take effect once.

`await ledger.call(tool, run_id=..., tool_call_id=..., tenant_id=..., arguments={...})` walks
the flow of docs/architecture.md ("A call, step by step"):

1. validate the arguments and fingerprint them (`args_digest`);
2. read the key's record (the fast path). A completed key with the same digest returns its
   recorded result without touching Kafka; another digest is a `KeyConflictError`; a `started`
   or `indeterminate` key is a replay and goes to `toolledger.runtime.replay`. The fast path
   may skip a call, never decide to run one: only an accepted reservation runs a tool;
3. append `reserved` and await its verdict. No verdict in time: `abandoned` is appended in the
   background (retried until it lands) and the call fails closed with `LedgerUnavailable`,
   not attempted. A rejection is turned into the truth or an error by `replay.lost_reservation`;
4. run the tool (`toolledger.runtime.executor`: attempts, timeouts, classification). A
   pipelined tool (`external(pipelined=True)`) composes steps 3 to 5 otherwise
   (`toolledger.runtime.pipelined`): it runs once Kafka acknowledged its reservation, while
   the verdict is awaited;
5. append the outcome. Inside the reservation's deadline it returns on Kafka's acknowledgement
   (nobody else may settle the call before then, so the verdict can only agree); later, it
   awaits the verdict without ever giving up and returns the ledger's truth, which is an
   operator's decision rather than this late result if one was made meanwhile. An outcome
   that cannot be recorded at all (a result over TOOLLEDGER_PAYLOAD_MAX_BYTES, or one the
   store refuses) is replaced by `indeterminate` naming why, and `ToolResultUnrecordable` is
   raised at once: never a call `started` forever.

Steps 3 to 5 are the call protocol's (`toolledger.runtime.protocol`, with the runtime's
`WaitPolicy`: an outcome's verdict is awaited without giving up); every read and append goes
through the runtime port (`toolledger.runtime.port`), so `Ledger.stack` is only what the port
was built on, kept for tests and the drill.

Large arguments and results travel by reference (`toolledger.events.payloads`); arguments
over the maximum are refused before anything is reserved (`ToolArgumentsTooLarge`).

The embedded default is `await Ledger.memory()`; production is `await Ledger.connect()`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from pydantic import ValidationError

from toolledger.events.models import CallIndeterminate, CallReserved, call_key, utcnow
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, RunRecord
from toolledger.events.signing import SigningKey
from toolledger.projections.store import CallQuery
from toolledger.runtime import pipelined, replay
from toolledger.runtime.errors import (
    LedgerUnavailable,
    ToolArgumentsError,
    ToolArgumentsTooLarge,
    ToolCallAwaitingApproval,
    ToolResultUnrecordable,
    not_attempted,
)
from toolledger.runtime.executor import Attempted, CallIdentity, Indeterminate
from toolledger.runtime.outcome import ToolOutcome, own_outcome, settled_outcome, unsettled_error
from toolledger.runtime.pauses import resumable_runs
from toolledger.runtime.port import RuntimePort
from toolledger.runtime.protocol import CallProtocol, Landed, WaitPolicy
from toolledger.runtime.stack_port import StackPort
from toolledger.runtime.tools import PreparedCall, Tool
from toolledger.runtime.tracing import CallTrace, Phase
from toolledger.settings import ProjectorSettings, Settings, load_settings
from toolledger.stack import LedgerStack

log = logging.getLogger("toolledger.runtime")

T = TypeVar("T")

#: How long `close()` lets background appends (abandons, cancelled outcomes) finish.
_CLOSE_GRACE_S = 2.0


class Ledger:
    """The runtime's handle on the ledger: declares nothing, runs tools through `call()`."""

    def __init__(
        self,
        stack: LedgerStack,
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
        owns_stack: bool = False,
        embedded_signing_key: SigningKey | None = None,
    ) -> None:
        self.stack = stack
        self.embedded_signing_key = embedded_signing_key
        self.clock = clock
        #: What the runtime reads and appends through (`AgentRun` and the adapters too).
        self.port: RuntimePort = StackPort(stack)
        self.protocol = CallProtocol(self.port, WaitPolicy.runtime(verdict_timeout), clock=clock)
        self._owns_stack = owns_stack
        self._runs = pipelined.RunBindings()

    @classmethod
    async def memory(
        cls,
        signing_key: SigningKey | None = None,
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
        payload_limits: PayloadLimits | None = None,
    ) -> Ledger:
        """The embedded ledger: memory log, memory store, in-process projector.

        It plays every role in one process, so it keeps an operator's signing key
        (`embedded_signing_key`; without `signing_key` a fresh one is made) to sign approvals
        and resolutions that its own projector verifies. `connect()` keeps no key.
        `payload_limits` default to the settings' defaults (docs/payloads.md).
        """
        key = signing_key or SigningKey.generate(f"local-{secrets.token_hex(4)}")
        stack = await LedgerStack.memory(verify_keys=key.verify_keys(), limits=payload_limits)
        return cls(
            stack,
            verdict_timeout=verdict_timeout,
            clock=clock,
            owns_stack=True,
            embedded_signing_key=key,
        )

    @classmethod
    async def connect(
        cls,
        settings: Settings | None = None,
        *,
        run_projector: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> Ledger:
        """Kafka and PostgreSQL, from `settings` or the `TOOLLEDGER_*` environment.

        A bad or missing setting raises `ConfigError` naming the variable. A runtime reads the
        shared block only and holds no key (docs/security.md). Every call awaits a verdict from
        a projector, so one must be running: separate processes in production
        (`toolledger projector`), or `run_projector=True` for one in this process (tests,
        single-node setups), which then needs `TOOLLEDGER_VERIFY_KEYS`. Without a projector,
        each call is refused, not attempted, after `TOOLLEDGER_VERDICT_TIMEOUT_S`.
        """
        if settings is None:
            settings = load_settings(ProjectorSettings) if run_projector else load_settings()
        stack = await LedgerStack.connect(settings, run_projector=run_projector)
        return cls(stack, verdict_timeout=settings.verdict_timeout_s, clock=clock, owns_stack=True)

    @classmethod
    def from_stack(
        cls,
        stack: LedgerStack,
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> Ledger:
        """A ledger on a stack the caller built and closes (tests, several runtimes on one)."""
        return cls(stack, verdict_timeout=verdict_timeout, clock=clock)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Let background appends finish briefly, then close the stack if this ledger made it."""
        await self.protocol.close(_CLOSE_GRACE_S)
        if self._owns_stack:
            await self.stack.close()

    @property
    def closing(self) -> bool:
        return self.protocol.closing

    @property
    def verdict_timeout(self) -> float:
        """How long a reservation waits for its verdict before the call is refused."""
        return self.protocol.policy.verdict_timeout

    async def read_call(self, key: str) -> CallRecord | None:
        """The key's record; `LedgerUnavailable` (nothing ran) if the store cannot be read.

        It reads this process's own writes: a `started` record whose outcome (or abandon) this
        process appended, returned on Kafka's acknowledgement before the projector folded it,
        is answered by that event's verdict, waited for up to the verdict timeout (then the
        record as stored). So a read right after `call` returned sees how the call ended.
        """
        record = await self.port.read_call(key)
        if record is None:
            return None
        return await self._own_write(record, within=self.protocol.policy.verdict_timeout)

    async def read_run(self, run_id: str) -> RunRecord | None:
        """The run's record; `LedgerUnavailable` if the store cannot be read."""
        return await self.port.read_run(run_id)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching `query`; `LedgerUnavailable` if the store cannot be read."""
        return await self.port.list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        """Runs in `statuses`; `LedgerUnavailable` if the store cannot be read."""
        return await self.port.list_runs(statuses, tenant_id=tenant_id)

    async def call(
        self,
        tool: Tool[Any, T],
        *,
        run_id: str,
        tool_call_id: str,
        tenant_id: str,
        arguments: Mapping[str, Any],
        run_version: int | None = None,
        warning: str | None = None,
    ) -> ToolOutcome[T]:
        """Run `tool` once for the key `<run_id>:<tool_call_id>`, or return what the ledger knows.

        `run_version` is the driver's checkpoint version (run fencing); `warning` is kept in the
        key's history with the reservation (a run driver notes an allowed duplicate intent).

        Raises `ToolCallIndeterminate` for an unknown call, and the errors of
        `toolledger.runtime.errors` for calls that cannot be made; a call that failed is
        returned as an outcome (`outcome.result()` raises `ToolCallFailed`).

        The call is an `execute_tool` span under the current one (docs/tracing.md).
        """
        key = call_key(run_id, tool_call_id)
        with CallTrace(tool.name, tool.effect.kind, run_id, tool_call_id, key) as traced:
            outcome = await self._call(
                tool, traced, run_id, tool_call_id, tenant_id, arguments, run_version, warning
            )
            return traced.outcome(outcome)

    async def _call(
        self,
        tool: Tool[Any, T],
        traced: CallTrace,
        run_id: str,
        tool_call_id: str,
        tenant_id: str,
        arguments: Mapping[str, Any],
        run_version: int | None,
        warning: str | None,
    ) -> ToolOutcome[T]:
        if not run_id or ":" in run_id or not tool_call_id or not tenant_id:
            raise ValueError(
                f"call {tool.name} needs a run_id without ':' and a non-empty tool_call_id and "
                f"tenant_id (got run_id={run_id!r}, tool_call_id={tool_call_id!r}, "
                f"tenant_id={tenant_id!r})"
            )
        who = CallIdentity(run_id, tool_call_id, tenant_id, call_key(run_id, tool_call_id))
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
        record = await self.port.read_call(who.key)
        if record is not None:
            record = await self._own_write(record)
            known = await replay.replay_known(self.protocol, tool, prepared, who, record)
            if known is not None:
                return known
        if tool.effect.pipelined:
            return await pipelined.call(self, tool, traced, prepared, who, run_version, warning)
        return await self._reserve_and_run(tool, traced, prepared, who, run_version, warning)

    async def _reserve_and_run(
        self,
        tool: Tool[Any, T],
        traced: CallTrace,
        prepared: PreparedCall,
        who: CallIdentity,
        run_version: int | None,
        warning: str | None = None,
    ) -> ToolOutcome[T]:
        protocol = self.protocol
        with traced.reserve() as phase:
            reserved = self._reservation(tool, prepared, who, run_version, warning, phase)
            try:
                verdict = await protocol.reserve(reserved)
            except LedgerUnavailable as exc:
                raise not_attempted(tool.name, who.key, exc) from exc
            phase.verdict(verdict)
        self._runs.learn(verdict.run)
        if not verdict.accepted:
            return await replay.lost_reservation(
                protocol, tool, prepared, who, verdict, run_version
            )
        if verdict.call is not None and verdict.call.status == "awaiting_approval":
            raise ToolCallAwaitingApproval(key=who.key, tool=tool.name, record=verdict.call)
        with traced.tool() as phase:
            ended = await protocol.execute(tool, prepared, who, reserved)
            phase.ended(ended)
        traced.ran(ended)
        with traced.outcome_phase():
            return await self._record(tool, who, reserved, ended)

    def _reservation(
        self,
        tool: Tool[Any, T],
        prepared: PreparedCall,
        who: CallIdentity,
        run_version: int | None,
        warning: str | None,
        phase: Phase,
    ) -> CallReserved:
        """The call's reservation, carrying the reserve phase's trace context."""
        return self.protocol.reservation(
            tool,
            prepared,
            who,
            run_version=run_version,
            warning=warning,
            trace_context=phase.trace_context(),
        )

    async def _record(
        self, tool: Tool[Any, T], who: CallIdentity, reserved: CallReserved, ended: Attempted
    ) -> ToolOutcome[T]:
        landed = await self.protocol.record(who, reserved, ended)
        return await self._answer(tool, who, reserved, ended, landed)

    async def _answer(
        self,
        tool: Tool[Any, T],
        who: CallIdentity,
        reserved: CallReserved,
        ended: Attempted,
        landed: Landed,
    ) -> ToolOutcome[T]:
        """The answer of an accepted reservation whose outcome landed."""
        if landed.unrecordable is not None:
            assert isinstance(landed.event, CallIndeterminate)
            return await self._unrecorded(tool, landed.event, landed.unrecordable)
        event = landed.event
        if not isinstance(ended, Indeterminate) and self.clock() < reserved.deadline:
            # Inside the deadline nobody else may settle the call: the verdict can only agree.
            self.protocol.own_writes.remember(who.key, reserved.reservation_id, event.event_id)
            return own_outcome(tool, who.key, ended)
        verdict = await self.protocol.await_outcome_verdict(who.key, event.event_id)
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

    async def _own_write(self, record: CallRecord, within: float | None = None) -> CallRecord:
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

    def resumable_runs(
        self, *, tenant_id: str | None = None, poll_interval: float = 0.2, follow: bool = True
    ) -> AsyncIterator[RunRecord]:
        """Paused runs whose awaited call is settled (see `toolledger.runtime.pauses`)."""
        return resumable_runs(
            self.port, tenant_id=tenant_id, poll_interval=poll_interval, follow=follow
        )

    async def wait_background(self, timeout: float) -> bool:
        """Wait for background appends (abandons, cancelled outcomes) to land; True if all did."""
        return await self.protocol.wait_background(timeout)
