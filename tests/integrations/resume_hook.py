"""The host side of `toolledger resumer --app tests.integrations.resume_hook:resume`.

What a host of a framework run does when the resumer says a paused run may go on: rebuild the
run's framework driver (`tests.integrations.drivers`: a LangGraph graph on its checkpointer, a
PydanticAI agent with its saved requests and history, an OpenAI agent with its `RunState`
JSON) and resume it from the framework's own persistence in `$TEST_STORE`, in this process,
which is not the one that started the run. Each resume appends one JSON line (the step and
what the model heard) to `$TEST_STORE/resumed.jsonl`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from tests.fake_billing import FakeBilling, use_service
from tests.integrations.drivers import driver
from toolledger import Ledger, RunRecord
from toolledger.integrations import decode_run_id


async def resume(run: RunRecord) -> None:
    use_service(FakeBilling(Path(os.environ["BILLING_DB"])))
    store = Path(os.environ["TEST_STORE"])
    async with await Ledger.connect() as ledger:  # as docs/integrations/index.md says
        framework = driver(
            os.environ["TEST_FRAMEWORK"], ledger, tool=os.environ["TEST_TOOL"], store=store
        )
        step = await framework.resume(decode_run_id(run.run_id))
    line = {"run_id": run.run_id, "step": asdict(step), "heard": framework.heard}
    with (store / "resumed.jsonl").open("a") as log:
        log.write(json.dumps(line) + "\n")
