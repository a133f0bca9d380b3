"""The host side of `toolledger resumer --app tests.integration.resume_hook:resume`.

What a real host does: rebuild the run's driver and resume it, on a `Ledger` it opens for the
resume and closes after (docs/integrations/index.md, "The resume hook"). The model here
finishes as soon as it hears the awaited call's result. Each resume is logged to `$RESUME_LOG`.

`$RESUME_FAILURES` makes it a broken host: the first N calls in this process raise before
anything is resumed (`always`: every call), as a hook whose model or database is down would.
Each call, failed or not, appends `<run_id> called` to `$RESUME_LOG.calls`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.fake_billing import FakeBilling, use_service
from tests.run_tools import ScriptedModel, runs_billing
from toolledger import Ledger, RunRecord
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.runs import AgentRun, FinalAnswer

FAILURES_ENV = "RESUME_FAILURES"
_calls: list[str] = []


async def resume(run: RunRecord) -> None:
    _calls.append(run.run_id)
    log_path = Path(os.environ["RESUME_LOG"])
    with Path(f"{log_path}.calls").open("a") as calls:
        calls.write(f"{run.run_id} called\n")
    failures = os.environ.get(FAILURES_ENV, "0")
    if failures == "always" or len(_calls) <= int(failures):
        raise RuntimeError(f"the host's model is unreachable (call {len(_calls)})")
    use_service(FakeBilling(Path(os.environ["BILLING_DB"])))
    model = ScriptedModel(FinalAnswer("resumed"))
    async with await Ledger.connect() as ledger:
        result = await AgentRun(
            ledger,
            run_id=run.run_id,
            tenant_id=str(run.tenant_id),
            agent=AgentConfig(name="billing-assistant"),
            tools=runs_billing,
            model=model,
        ).resume()
    told = model.last_tool_message()
    with log_path.open("a") as log:
        log.write(f"{run.run_id} {result.status} {told['status']}\n")
