"""A run's own events (started, checkpointed, paused, resumed, finished), appended one way.

`AgentRun` appends them for the runs it drives and `FrameworkRuns` for the pauses of runs an
agent framework drives; both need the same envelope and the same answer to a rejection: a run
event the ledger rejected means the run is no longer this driver's to write (another driver
checkpointed it, it finished, or it is another tenant's), which is `RunSuperseded` naming the
run and why, for the application to handle.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from toolledger.events.models import RunEvent
from toolledger.events.records import Verdict
from toolledger.port import RuntimePort
from toolledger.runtime.errors import RunSuperseded


class RunEnvelope(TypedDict):
    """The envelope fields every event of one run carries (its key is the run_id)."""

    key: str
    run_id: str
    tenant_id: str
    occurred_at: datetime


def run_envelope(run_id: str, tenant_id: str, at: datetime) -> RunEnvelope:
    """The envelope of an event of run `run_id` (of `tenant_id`), occurring `at`."""
    return {"key": run_id, "run_id": run_id, "tenant_id": tenant_id, "occurred_at": at}


async def append_run_event(port: RuntimePort, event: RunEvent, timeout: float) -> Verdict:
    """Append `event` and return its accepted verdict; `RunSuperseded` if it was rejected."""
    verdict = await port.append_and_await(event, timeout)
    if not verdict.accepted:
        raise RunSuperseded.of_run(
            event.run_id, f"{event.type} was rejected ({verdict.reason}): {verdict.detail}"
        )
    return verdict
