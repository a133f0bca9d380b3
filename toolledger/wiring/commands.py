"""Commands: append a request to the log, then await its durable verdict.

This is the only way runtimes, the operator API and processors change the ledger. A resend
after an ambiguous append error reuses the same bytes, hence the same event_id, and the
projector applies each event_id once, so retrying an append can never apply a request twice.

It is also where payloads go by reference (`toolledger.events.payloads`): every request is
offloaded before it is encoded, its blobs stored in the ledger store first, and the readers that
need the text back (`restored_call`, `restored_run`, `restored_event`) come here for it. A
record the log refuses for its size (`RecordTooLarge`) and a payload over the maximum
(`PayloadTooLarge`) are permanent: they are raised at once, never resent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import TypeVar

from pydantic import TypeAdapter

from toolledger.errors import LedgerUnavailable, seconds
from toolledger.events.codec import encode
from toolledger.events.fold import HistoryEntry
from toolledger.events.log import EventLog, LogError, Position, RecordTooLarge
from toolledger.events.models import AnyEvent, Event, OperatorEvent
from toolledger.events.payloads import (
    PayloadError,
    PayloadLimits,
    PayloadRefused,
    call_blobs,
    event_blobs,
    offload,
    restore_call,
    restore_event,
    restore_run,
    run_blobs,
)
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.projections.dberrors import database_errors, transient_database_error
from toolledger.projections.store import LedgerStore
from toolledger.projections.verdicts import VerdictWaiter

log = logging.getLogger("toolledger.commands")


E = TypeVar("E", bound=Event)
_EVENT: TypeAdapter[Event] = TypeAdapter(AnyEvent)


class LedgerCommands:
    """Appends events to the events topic and awaits their verdicts.

    `blobs` is the store that keeps payloads too large to travel inline; without one (a bare
    log in a test) nothing is offloaded and an oversized event meets `RecordTooLarge`.
    """

    def __init__(
        self,
        events: EventLog,
        waiter: VerdictWaiter,
        blobs: LedgerStore | None = None,
        limits: PayloadLimits | None = None,
    ) -> None:
        self.events = events
        self.waiter = waiter
        self.blobs = blobs
        self.limits = limits or PayloadLimits()

    async def offload(self, event: E) -> E:
        """`event` with its large payloads by reference, their blobs stored durably first.

        Raises `PayloadTooLarge` (over the maximum) and `PayloadRefused` (the store said no),
        both permanent, and `LedgerUnavailable` when the store cannot be reached (try again).
        An operator event must be offloaded before it is signed: the signature covers the
        digests, so offloading a signed one would void it.
        """
        if self.blobs is None:
            return event
        light, blobs = offload(event, self.limits)
        if not blobs:
            return event
        if isinstance(event, OperatorEvent) and event.signature is not None:
            raise PayloadError(
                f"operator event for {event.key} was signed before its large payload was "
                "offloaded; offload it first (LedgerCommands.offload), then sign it"
            )
        try:
            await self.blobs.put_blobs(blobs)
        except database_errors() as exc:
            size = sum(map(len, blobs.values()))
            if transient_database_error(exc):
                raise LedgerUnavailable(
                    f"cannot store the {size}-byte payload of {event.type} for {event.key} "
                    f"({exc!r}); PostgreSQL is unreachable"
                ) from exc
            raise PayloadRefused(event.key, size, repr(exc)) from exc
        return light

    async def append(self, event: Event, timeout: float) -> Position:
        """Append `event` durably, resending the same bytes on errors until `timeout` passes.

        Large payloads go by reference first (`offload`); `RecordTooLarge` and the permanent
        `PayloadError`s are raised at once: resending could only fail the same way.
        """
        event = await self.offload(event)
        data = encode(event)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                # asyncio.timeout, not wait_for: no task per append on the hot path.
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    return await self.events.append(event.run_id, data)
            except RecordTooLarge:
                raise
            except (LogError, TimeoutError) as exc:
                if time.monotonic() + delay >= deadline:
                    raise LedgerUnavailable(
                        f"could not append {event.type} for {event.key} within {seconds(timeout)} "
                        f"({exc}); Kafka is unreachable"
                    ) from exc
                log.warning("append of %s failed (%s); resending", event.event_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        """Append `event` and return the projector's verdict on it.

        Raises `LedgerUnavailable` when no verdict arrives within `timeout` seconds (the
        event may still be applied later; callers that must know append a compensating
        request such as `CallAbandoned`).
        """
        started = time.monotonic()
        expected = self.waiter.expect(event.event_id)
        try:
            await self.append(event, timeout)
            remaining = max(timeout - (time.monotonic() - started), 0.001)
            return await self.waiter.wait(event.event_id, remaining, expected)
        finally:
            self.waiter.discard(event.event_id, expected)

    # -- reading payloads back ----------------------------------------------------------------

    async def restored_call(self, call: CallRecord) -> CallRecord:
        """The record with its referenced arguments and result text back in place."""
        digests = call_blobs(call)
        return restore_call(call, await self._blobs(digests)) if digests else call

    async def restored_run(self, run: RunRecord) -> RunRecord:
        """The run with its referenced transcript back in place."""
        digests = run_blobs(run)
        return restore_run(run, await self._blobs(digests)) if digests else run

    async def restored_event(self, event: E) -> E:
        """The event with its referenced payloads back in place (audit, history views)."""
        digests = event_blobs(event)
        return restore_event(event, await self._blobs(digests)) if digests else event

    async def restored_entry(self, entry: HistoryEntry) -> HistoryEntry:
        """A history entry whose event shows its referenced payloads (a view: `chain_hash` stays
        the stored one, over the event as logged)."""
        if '_blob":' not in entry.event_json:
            return entry
        event = _EVENT.validate_json(entry.event_json)
        restored = await self.restored_event(event)
        return entry.model_copy(update={"event_json": restored.history_json()})

    async def restored_verdict(self, verdict: Verdict) -> Verdict:
        """The verdict with its call's payloads back in place."""
        if verdict.call is None or not call_blobs(verdict.call):
            return verdict
        return verdict.model_copy(update={"call": await self.restored_call(verdict.call)})

    async def _blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        if self.blobs is None:
            return {}
        try:
            return await self.blobs.get_blobs(digests)
        except database_errors() as exc:
            raise LedgerUnavailable(
                f"cannot read payload blobs {sorted(digests)} ({exc!r}); PostgreSQL is unreachable"
            ) from exc
