"""The pauses of runs an agent framework drives: recorded in the ledger, like `AgentRun`'s.

A LangGraph thread that `interrupt()`s, a PydanticAI run that ends with `DeferredToolRequests`,
an OpenAI Agents run stopped at an interruption: each waits on one call the ledger cannot
answer yet. Without a record of it the run's record says `running` and `toolledger resumer`
never fires. `FrameworkRuns` appends what `AgentRun` appends for its own pauses, for a run that
has no checkpoints here (the framework checkpoints it and fences its own drivers, so the events
carry no version: schema v2 of `run_paused` and `run_resumed`):

- `paused(run_id, reason, waiting_on)` appends `run_paused` unless the run already waits on a
  call whose wait is not over (one `waiting_on` at a time: the first pause of a step is
  recorded, and a call still unsettled when the run goes on pauses it again);
- `going_on(run_id)` appends `run_resumed` once the awaited call is settled (or its approval
  decided): the adapter calls it when it answers a call of the run.

Both read the run first and append nothing when there is nothing new, so a framework that asks
again and again (a LangGraph resume re-running its tools node) records each fact once. The
calls of one run in one process are recorded one at a time (a lock per run): LangGraph runs a
step's tool calls concurrently, and a `run_resumed` decided before another call's `run_paused`
landed must not erase that pause. A run driven by `AgentRun` (it has checkpoints) is left
alone: its driver records its own pauses.
"""

from __future__ import annotations

import asyncio

from toolledger.events.models import PauseReason, RunEvent, RunPaused, RunResumed
from toolledger.events.records import RunRecord
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.pauses import PAUSED, wait_is_over
from toolledger.runtime.run_events import RunEnvelope, append_run_event, run_envelope


class FrameworkRuns:
    """Records the pauses and resumes of the framework runs of one tenant, through `ledger`."""

    def __init__(self, ledger: Ledger, tenant_id: str) -> None:
        self.ledger = ledger
        self.tenant_id = tenant_id
        self._locks: dict[str, asyncio.Lock] = {}

    async def paused(self, run_id: str, reason: PauseReason, waiting_on: str) -> RunRecord | None:
        """Record that the run waits on `waiting_on` (for `reason`); the run's record."""
        async with self._one_at_a_time(run_id):
            run = await self.ledger.read_run(run_id)
            if run is None or run.version is not None:
                return run  # no call reserved yet (nothing to wait on), or AgentRun's own run
            if run.status in PAUSED and run.waiting_on is not None:
                if run.waiting_on == waiting_on and run.status == reason:
                    return run
                if not await self._wait_over(run):
                    return run  # it still waits on an earlier call of this step
            event = RunPaused(**self._envelope(run_id), reason=reason, waiting_on=waiting_on)
            return await self._append(event, run)

    async def going_on(self, run_id: str) -> RunRecord | None:
        """Record that the run goes on, if it was paused and its wait is over; its record."""
        async with self._one_at_a_time(run_id):
            run = await self.ledger.read_run(run_id)
            if run is None or run.version is not None or run.status not in PAUSED:
                return run
            if not await self._wait_over(run):
                return run
            return await self._append(RunResumed(**self._envelope(run_id)), run)

    async def _wait_over(self, run: RunRecord) -> bool:
        call = await self.ledger.read_call(run.waiting_on) if run.waiting_on else None
        return wait_is_over(run, call)

    async def _append(self, event: RunEvent, run: RunRecord) -> RunRecord:
        # Rejected: the run changed in a way a framework run cannot (it was started with
        # checkpoints, or belongs to another tenant): the application's error, not ours.
        ledger = self.ledger
        verdict = await append_run_event(ledger.port, event, ledger.verdict_timeout)
        return verdict.run if verdict.run is not None else run

    def _one_at_a_time(self, run_id: str) -> asyncio.Lock:
        # Kept for the adapter's life (one small lock per run it saw): dropping a lock while
        # another task waits on it would let a third task take a new one beside it.
        return self._locks.setdefault(run_id, asyncio.Lock())

    def _envelope(self, run_id: str) -> RunEnvelope:
        return run_envelope(run_id, self.tenant_id, self.ledger.clock())
