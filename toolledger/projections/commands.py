"""Commands: append a request to the log, then await its durable verdict.

This is the only way runtimes, the operator API and processors change the ledger. A resend
after an ambiguous append error reuses the same bytes, hence the same event_id, and the
projector applies each event_id once, so retrying an append can never apply a request twice.
"""

from __future__ import annotations

import asyncio
import logging
import time

from toolledger.events.codec import encode
from toolledger.events.log import EventLog, LogError, Position
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.projections.verdicts import LedgerUnavailable, VerdictWaiter, seconds

log = logging.getLogger("toolledger.commands")


class LedgerCommands:
    """Appends events to the events topic and awaits their verdicts."""

    def __init__(self, events: EventLog, waiter: VerdictWaiter) -> None:
        self.events = events
        self.waiter = waiter

    async def append(self, event: Event, timeout: float) -> Position:
        """Append `event` durably, resending the same bytes on errors until `timeout` passes."""
        data = encode(event)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                # asyncio.timeout, not wait_for: no task per append on the hot path.
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    return await self.events.append(event.run_id, data)
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
