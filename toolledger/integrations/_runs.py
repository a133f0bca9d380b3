"""A framework's pause is the run's pause: what the adapters tell the ledger, and what they raise.

`RunPauses` hands each `Pause` of an adapter to the runtime's `FrameworkRuns`
(toolledger/runtime/framework_runs.py), which records it as the run's pause (`run_paused`,
`waiting_on` naming the call) and the answer after it as the run going on (`run_resumed`), so
the console shows the run paused and `toolledger resumer` wakes it when the call is settled.
`RunStillPaused` is what a resume helper raises (PydanticAI's `LedgerToolset.resume`) when a
call it waits on is still unsettled: the calls, and the command that settles each.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolledger import ToolLedgerError
from toolledger.integrations._calls import Pause
from toolledger.runtime import FrameworkRuns, Ledger, RunRecord

__all__ = ["RunPauses", "RunStillPaused"]


class RunPauses:
    """Records the pauses and resumes of the framework runs of one adapter."""

    def __init__(self, ledger: Ledger, tenant_id: str) -> None:
        self.runs = FrameworkRuns(ledger, tenant_id)

    async def paused(self, pause: Pause) -> RunRecord | None:
        """Record that the run of `pause.key` waits on `pause.waiting_on`; the run's record."""
        run_id = pause.key.partition(":")[0]
        return await self.runs.paused(run_id, pause.reason, pause.waiting_on)

    async def going_on(self, run_id: str) -> RunRecord | None:
        """Record that the run goes on, if it was paused and its wait is over; its record."""
        return await self.runs.going_on(run_id)


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
