"""The host side of `toolledger resumer --app tests.integration.resume_hook:resume`.

What a real host does: rebuild the run's driver and resume it. The model here finishes as soon
as it hears the awaited call's result. Each resume is logged to `$RESUME_LOG`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.fake_billing import FakeBilling, use_service
from tests.run_tools import ScriptedModel, runs_billing
from toolledger import Ledger
from toolledger.events.records import RunRecord
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.runs import AgentRun, FinalAnswer

_ledger: list[Ledger] = []


async def resume(run: RunRecord) -> None:
    if not _ledger:
        _ledger.append(await Ledger.connect())
    use_service(FakeBilling(Path(os.environ["BILLING_DB"])))
    model = ScriptedModel(FinalAnswer("resumed"))
    result = await AgentRun(
        _ledger[0],
        run_id=run.run_id,
        tenant_id=str(run.tenant_id),
        agent=AgentConfig(name="billing-assistant"),
        tools=runs_billing,
        model=model,
    ).resume()
    told = model.last_tool_message()
    with Path(os.environ["RESUME_LOG"]).open("a") as log:
        log.write(f"{run.run_id} {result.status} {told['status']}\n")
