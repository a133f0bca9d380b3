"""CallProtocol: reserve -> execute -> record, written once, with explicit waits.

Every process that makes a ledgered call walks the same steps (docs/architecture.md, "A call,
step by step"); what differs between them is only how long each may wait, which is a
`CallWaits` and nothing else:

1. **Reserve.** `reservation()` builds the `CallReserved` (deadline = now + the tool's budget).
   Reserving is two steps, `append_reservation()` (returns on Kafka's acknowledgement) and
   `await_reservation_verdict()`; `reserve()` does both in one round trip, the verdict
   registered for before the append (the verdict-first flow: no tool runs before an accepted
   verdict); `read_or_reserve()` is `reserve()` unless the key has a record, in one round trip
   where the port can. A step that fails (`LedgerUnavailable`) or whose caller is cancelled appends
   `abandoned` in the background, *until it lands*, and raises: a reservation accepted later is
   then settled failed, not attempted, instead of `started` with nobody running it.
2. **Execute** the tool (`toolledger.runtime.executor`); a caller cancelled mid-tool still gets
   the tool's outcome recorded, in the background.
3. **Record.** `record()` appends the outcome until it lands (shielded, in the background, so a
   caller that gives up cannot take the outcome of a tool that ran down with it). An outcome
   that can never be recorded (too large, refused by the store) is replaced by `indeterminate`
   saying why, so a call is never left `started`. `await_outcome_verdict()` then waits for its
   verdict as the policy says: *forever* for a runtime (the outcome is in the log; the answer
   must be the ledger's truth, not a guess), or *bounded* for an API request, which raises
   `OutcomeVerdictPending`, saying the outcome is in the log and will be applied.

`settle()` appends a reconcile finding and awaits its verdict within the verdict timeout (the
reconciler asks again later on `LedgerUnavailable`; a replaying runtime answers "unknown").

The steps are separate methods, composed once, by `toolledger.runtime.pipeline.CallPipeline`
(verdict first: reserve, execute, record; pipelined: append the reservation, execute, record
while the reservation's verdict is awaited with `await_verdict_after_running`, which like an
outcome's is never abandoned once the tool ran).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from toolledger.errors import LedgerUnavailable, seconds
from toolledger.events.log import RecordTooLarge
from toolledger.events.models import CallAbandoned, CallEvent, CallReserved
from toolledger.events.payloads import PayloadError
from toolledger.events.records import CallRecord, Verdict
from toolledger.port import NothingReserved, RuntimePort
from toolledger.runtime.executor import Attempted, CallIdentity, envelope, execute
from toolledger.runtime.recording import (
    BackgroundAppends,
    Outcome,
    OwnWrites,
    outcome_event,
    unrecordable_event,
)
from toolledger.runtime.tools import PreparedCall, Tool

log = logging.getLogger("toolledger.runtime")


class OutcomeVerdictPending(LedgerUnavailable):
    """A tool ran and its outcome is in the log (or being appended until it lands), but its
    verdict did not come within the wait allowed: the outcome will be applied; read the call
    again later. Raised by a bounded `CallWaits`, and by any policy once the ledger closes."""

    code = "outcome_verdict_pending"


@dataclass(frozen=True)
class CallWaits:
    """How long each step of a call may wait.

    - `verdict_timeout`: the reservation's verdict (no verdict: abandoned, not attempted), a
      finding's, and each single try of an append.
    - `outcome_wait`: the outcome's landing and then its verdict, each. None: for as long as it
      takes (a runtime); seconds: bounded, then `OutcomeVerdictPending` (an API request).
    - `resend_every`: the pause between two tries of an event that must land. Abandons and
      outcomes are always appended until they land, in the background: an abandon tried once
      could leave an accepted reservation `started` with nobody running it.
    - `answer_on_ack`: an outcome appended inside its reservation's deadline is answered on
      Kafka's acknowledgement, its verdict not awaited (nobody else may settle the call before
      the deadline, so the verdict can only agree). A runtime does; a request that hands the
      ledger's record back (a compensation) awaits the verdict.
    """

    verdict_timeout: float = 10.0
    outcome_wait: float | None = None
    resend_every: float = 0.1
    answer_on_ack: bool = True

    def __post_init__(self) -> None:
        bound = 1.0 if self.outcome_wait is None else self.outcome_wait
        waits = (self.verdict_timeout, self.resend_every, bound)
        if min(waits) <= 0:
            raise ValueError(f"every wait of a CallWaits must be positive: {self}")

    @classmethod
    def runtime(cls, verdict_timeout: float) -> CallWaits:
        """An agent runtime's: an outcome's verdict is awaited without ever giving up."""
        return cls(verdict_timeout=verdict_timeout)

    @classmethod
    def request(cls, verdict_timeout: float) -> CallWaits:
        """A request somebody waits on (the API's compensations, a reconciler's question):
        every wait bounded by `verdict_timeout`."""
        return cls(
            verdict_timeout=verdict_timeout, outcome_wait=verdict_timeout, answer_on_ack=False
        )


class Landed(NamedTuple):
    """An outcome that landed in the log: the tool's own, or the `indeterminate` recorded in
    its place (`unrecordable` then says why the tool's could not be)."""

    event: Outcome
    unrecordable: str | None = None


class CallProtocol:
    """The steps of one ledgered call over `port`, waiting as `policy` says."""

    def __init__(
        self, port: RuntimePort, policy: CallWaits, *, clock: Callable[[], datetime]
    ) -> None:
        self.port = port
        self.policy = policy
        self.clock = clock
        #: What this process appended that may not be folded yet (read-your-writes).
        self.own_writes = OwnWrites()
        self._background = BackgroundAppends()
        self._closing = False

    @property
    def closing(self) -> bool:
        return self._closing

    async def close(self, grace: float) -> None:
        """Stop waiting for verdicts; let background appends land for `grace` seconds."""
        self._closing = True
        await self._background.close(grace)

    async def wait_background(self, timeout: float) -> bool:
        """Wait for background appends (abandons, outcomes) to land; True if all did."""
        return await self._background.wait(timeout)

    # -- 1. reserve ---------------------------------------------------------------------------

    def reservation(
        self,
        tool: Tool[Any, Any],
        prepared: PreparedCall,
        who: CallIdentity,
        *,
        run_version: int | None = None,
        warning: str | None = None,
        compensates: str | None = None,
        trace_context: tuple[str | None, str | None] = (None, None),
    ) -> CallReserved:
        """The reservation of `who` for `tool` with `prepared` arguments, due by its budget."""
        now = self.clock()
        return CallReserved(
            **envelope(who, now),
            run_version=run_version,
            tool=tool.name,
            effect=tool.effect.kind,
            args_digest=prepared.digest,
            arguments_json=prepared.arguments_json,
            requires_approval=tool.effect.approval,
            deadline=now + timedelta(seconds=tool.budget),
            compensates=compensates,
            warning=warning,
            traceparent=trace_context[0],
            tracestate=trace_context[1],
        )

    async def reserve(self, reserved: CallReserved) -> Verdict:
        """Append `reserved` and await its verdict in one round trip, within the verdict
        timeout. `LedgerUnavailable`: nothing may run; the reservation is being abandoned."""
        try:
            return await self.port.append_and_await(reserved, self.policy.verdict_timeout)
        except (asyncio.CancelledError, LedgerUnavailable):
            self.abandon(reserved)
            raise

    async def read_or_reserve(self, reserved: CallReserved) -> CallRecord | Verdict:
        """The key's record if it has one (nothing appended), else `reserve(reserved)`: a new
        call's read and reservation in one round trip where the port can
        (`RuntimePort.read_or_reserve`). A failed read (`NothingReserved`) abandons nothing."""
        try:
            return await self.port.read_or_reserve(reserved, self.policy.verdict_timeout)
        except NothingReserved:
            raise
        except (asyncio.CancelledError, LedgerUnavailable):
            self.abandon(reserved)
            raise

    async def read_or_append_reservation(self, reserved: CallReserved) -> CallRecord | None:
        """`append_reservation(reserved, watch=True)` unless the key has a record: then that
        record, nothing appended and nothing watched (`RuntimePort.read_or_append`). A failed
        read (`NothingReserved`) abandons nothing."""
        self.port.watch_verdict(reserved.event_id)
        try:
            found = await self.port.read_or_append(reserved, self.policy.verdict_timeout)
        except NothingReserved:
            self.unwatch(reserved)
            raise
        except (asyncio.CancelledError, LedgerUnavailable):
            self.unwatch(reserved)
            self.abandon(reserved)
            raise
        if found is not None:
            self.unwatch(reserved)
        return found

    async def append_reservation(self, reserved: CallReserved, *, watch: bool = False) -> None:
        """Append `reserved`, returning on Kafka's acknowledgement (its verdict not awaited).

        `watch`: its verdict is watched for from before the append (`RuntimePort.watch_verdict`),
        for a caller that awaits it later (`await_verdict_after_running`) and must call
        `unwatch` if it never does.
        """
        if watch:
            self.port.watch_verdict(reserved.event_id)
        try:
            await self.port.append(reserved, self.policy.verdict_timeout)
        except (asyncio.CancelledError, LedgerUnavailable):
            self.unwatch(reserved)
            self.abandon(reserved)
            raise
        except BaseException:
            self.unwatch(reserved)
            raise

    def unwatch(self, reserved: CallReserved) -> None:
        """Stop watching for the verdict of `reserved` (nothing if it was awaited already)."""
        self.port.unwatch_verdict(reserved.event_id)

    async def await_reservation_verdict(
        self, reserved: CallReserved, timeout: float | None = None
    ) -> Verdict:
        """The verdict on an appended reservation, within `timeout` (default: the verdict
        timeout). `LedgerUnavailable`: the reservation is being abandoned."""
        wait = self.policy.verdict_timeout if timeout is None else timeout
        try:
            return await self.port.await_verdict(reserved.event_id, wait)
        except (asyncio.CancelledError, LedgerUnavailable):
            self.abandon(reserved)
            raise

    def abandon(self, reserved: CallReserved) -> None:
        """Make sure a reservation whose verdict nobody will act on cannot start: `abandoned`
        settles it failed, not attempted, or tombstones it if it lands later. Appended in the
        background until it lands."""
        who = CallIdentity(reserved.run_id, reserved.tool_call_id, reserved.tenant_id, reserved.key)
        abandon = CallAbandoned(
            **envelope(who, self.clock()), reservation_id=reserved.reservation_id
        )
        self.own_writes.remember(reserved.key, reserved.reservation_id, abandon.event_id)
        self._background.spawn(self._until_landed(abandon), f"abandon {reserved.key}")

    # -- 2. execute ---------------------------------------------------------------------------

    async def execute(
        self,
        tool: Tool[Any, Any],
        prepared: PreparedCall,
        who: CallIdentity,
        reserved: CallReserved,
    ) -> Attempted:
        """Run the tool of an accepted reservation; a cancelled caller's outcome still lands."""

        def record_cancelled(ended: Attempted) -> None:
            self.record_in_background(who, reserved, ended)

        return await execute(tool, prepared, who, clock=self.clock, on_cancel=record_cancelled)

    # -- 3. record ----------------------------------------------------------------------------

    async def record(self, who: CallIdentity, reserved: CallReserved, ended: Attempted) -> Landed:
        """Append how the tool ended until it lands, and return what landed."""
        return await self.landed(who.key, self.recording(who, reserved, ended))

    def recording(
        self, who: CallIdentity, reserved: CallReserved, ended: Attempted
    ) -> asyncio.Future[Landed]:
        """Start appending how the tool ended, in the background until it lands, and return
        the landing for `landed` (a caller with something else to await meanwhile: a pipelined
        call awaits its reservation's verdict). The append starts at once (an embedded log's
        is done before this returns); what is left of it goes on in a task."""
        event = outcome_event(envelope(who, self.clock()), reserved.reservation_id, ended)
        return self._background.start(self._land(who, event), f"outcome of {who.key}")

    async def landed(self, key: str, landing: asyncio.Future[Landed]) -> Landed:
        """What `landing` landed, waiting as the policy says; shielded, so a caller that gives
        up does not take the outcome of a tool that ran down with it."""
        if landing.done():
            return landing.result()
        if self.policy.outcome_wait is None:
            return await asyncio.shield(landing)
        try:
            async with asyncio.timeout(self.policy.outcome_wait):
                return await asyncio.shield(landing)
        except TimeoutError:
            raise OutcomeVerdictPending(
                f"the outcome of {key} was not acknowledged by Kafka within "
                f"{seconds(self.policy.outcome_wait)}; it is being appended in the background "
                "until it lands and will then be applied: read the call again later"
            ) from None

    def record_in_background(
        self, who: CallIdentity, reserved: CallReserved, ended: Attempted
    ) -> None:
        """Record how the tool ended for a caller that no longer waits (it was cancelled)."""
        event = outcome_event(envelope(who, self.clock()), reserved.reservation_id, ended)
        self.own_writes.remember(who.key, reserved.reservation_id, event.event_id)
        self._background.spawn(self._land(who, event), f"outcome of {who.key}")

    async def await_outcome_verdict(self, key: str, event_id: uuid.UUID) -> Verdict:
        """The verdict of the outcome `event_id` of `key`, waiting as the policy says."""
        return await self._await_after_running(key, event_id, "the outcome")

    async def await_verdict_after_running(self, reserved: CallReserved) -> Verdict:
        """The verdict on a reservation whose tool has already run (a pipelined call), awaited
        as an outcome's is: never abandoned (`abandoned` could settle the call "not attempted"
        while its effect happened) and never given up on by a runtime, because the call's
        answer depends on it."""
        return await self._await_after_running(reserved.key, reserved.event_id, "the reservation")

    async def _await_after_running(self, key: str, event_id: uuid.UUID, what: str) -> Verdict:
        bound = self.policy.outcome_wait
        waited = 0.0
        while True:
            wait = self.policy.verdict_timeout if bound is None else bound
            try:
                return await self.port.await_verdict(event_id, wait)
            except LedgerUnavailable as exc:
                waited += wait
                if bound is not None or self.closing:
                    why = "the ledger was closed" if self.closing else f"after {seconds(waited)}"
                    raise OutcomeVerdictPending(
                        f"no verdict yet on {what} of {key} ({why}); {what} is in the log and "
                        "will be applied: read the call again"
                    ) from exc
                log.warning(
                    "no verdict on %s of %s after %.0fs (%s); still waiting, the run parks "
                    "until it arrives",
                    what,
                    key,
                    waited,
                    exc,
                )

    async def settle(self, finding: CallEvent) -> Verdict:
        """Append a reconcile finding and await its verdict, within the verdict timeout."""
        return await self.port.append_and_await(finding, self.policy.verdict_timeout)

    # -- appending what must land ---------------------------------------------------------------

    def _until_landed(self, event: CallEvent) -> Coroutine[Any, Any, None]:
        policy = self.policy
        return self.port.append_until_landed(
            event, each=policy.verdict_timeout, pause=policy.resend_every
        )

    async def _land(self, who: CallIdentity, event: Outcome) -> Landed:
        """Append an outcome until it lands; one that can never be recorded (too large, refused
        by the store) is replaced by `indeterminate` saying why, so the call is never left
        `started`."""
        try:
            await self._until_landed(event)
            return Landed(event)
        except (PayloadError, RecordTooLarge) as exc:
            log.error(
                "the outcome of %s cannot be recorded (%s); recording it unknown", who.key, exc
            )
            fallback = unrecordable_event(envelope(who, self.clock()), event, str(exc))
            self.own_writes.replace(who.key, event.event_id, by=fallback.event_id)
            await self._until_landed(fallback)
            return Landed(fallback, str(exc))
