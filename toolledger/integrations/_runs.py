"""A framework's pause is the run's pause: the ledger's run record says so, and the resumer sees it.

A LangGraph thread that `interrupt()`s, a PydanticAI run that ends with `DeferredToolRequests`,
an OpenAI Agents run stopped at an interruption: each waits on one call the ledger cannot
answer yet. Without a record of it the run's record says `running` and `toolledger resumer`
never fires. `RunPauses` appends what `AgentRun` appends for its own pauses, for a run that
has no checkpoints (the framework checkpoints it, and fences its own drivers):

- `paused(pause)` appends `run_paused` (`reason`, `waiting_on` naming the call) unless the run
  already waits on a call whose wait is not over (one `waiting_on` at a time: the first pause
  of a step is recorded, and a call still unsettled when the run goes on pauses it again);
- `going_on(run_id)` appends `run_resumed` once the awaited call is settled (or its approval
  decided), when the adapter answers a call of the run: the run is moving again.

Both read the run first and do nothing when there is nothing to record, so a framework that
asks again and again (a LangGraph resume re-running its tools node) appends each fact once.
Calls of one run in one process are recorded one at a time (a lock per run): LangGraph runs a
step's tool calls concurrently, and a `run_resumed` computed before another call's
`run_paused` landed must not erase that pause.

A run driven by `AgentRun` (it has checkpoints) is left alone: its driver records its pauses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from toolledger.errors import ToolLedgerError
from toolledger.events.models import Event, RunPaused, RunResumed
from toolledger.events.records import RunRecord
from toolledger.integrations._calls import Pause
from toolledger.runtime.errors import RunSuperseded
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.pauses import PAUSED, wait_is_over


class RunPauses:
    """Records the pauses and resumes of the framework runs of one adapter."""

    def __init__(self, ledger: Ledger, tenant_id: str) -> None:
        self.ledger = ledger
        self.tenant_id = tenant_id
        self._locks: dict[str, asyncio.Lock] = {}

    async def paused(self, pause: Pause) -> RunRecord | None:
        """Record that the run of `pause.key` waits on `pause.waiting_on`; the run's record."""
        run_id = pause.key.partition(":")[0]
        async with self._one_at_a_time(run_id):
            run = await self.ledger.read_run(run_id)
            if run is None or run.version is not None:
                return run  # no call reserved yet (nothing to wait on), or AgentRun's own run
            if run.status in PAUSED and run.waiting_on is not None:
                if run.waiting_on == pause.waiting_on and run.status == pause.reason:
                    return run
                if not await self._wait_over(run):
                    return run  # it still waits on an earlier call of this step
            event = RunPaused(
                **self._envelope(run_id), reason=pause.reason, waiting_on=pause.waiting_on
            )
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

    async def _append(self, event: Event, run: RunRecord) -> RunRecord:
        verdict = await self.ledger.port.append_and_await(event, self.ledger.verdict_timeout)
        if not verdict.accepted:
            # The ledger's run changed under us in a way a framework run cannot (it was started
            # with checkpoints, or belongs to another tenant): that is the application's error.
            raise RunSuperseded.of_run(
                run.run_id, f"{event.type} was rejected ({verdict.reason}): {verdict.detail}"
            )
        return verdict.run if verdict.run is not None else run

    def _one_at_a_time(self, run_id: str) -> asyncio.Lock:
        # Kept for the adapter's life (one small lock per run it saw): dropping a lock while
        # another task waits on it would let a third task take a new one beside it.
        return self._locks.setdefault(run_id, asyncio.Lock())

    def _envelope(self, run_id: str) -> dict[str, Any]:
        return {
            "key": run_id,
            "run_id": run_id,
            "tenant_id": self.tenant_id,
            "occurred_at": self.ledger.clock(),
        }


class RunStillPaused(ToolLedgerError):
    """A framework run was resumed while a call it waits on is still unsettled (or undecided).

    `pauses` are the calls still waited on; the message names each and the command that
    settles it. Nothing was run: resume again once they are settled (the resumer does).
    """

    code = "run_still_paused"

    def __init__(self, run_id: str, pauses: Sequence[Pause]) -> None:
        self.run_id = run_id
        self.pauses = list(pauses)
        waits = "; ".join(p.detail for p in self.pauses)
        super().__init__(f"run {run_id} cannot go on yet: {waits}")
