"""A run driver in its own OS process, for the run tests that need a real second process.

`python -m tests.integration.run_worker crash --run R --service DB --ready F` starts run R with
a model that charges once, and freezes inside the tool right after the billing system made the
charge (writes F, then waits to be SIGKILLed): the ledger says `started`, the effect exists.

`python -m tests.integration.run_worker resume --run R --service DB --ready F --go G --call C`
loads the run, writes F, waits for G, then resumes it with a model that answers one charge
with call id C and then finishes; prints what happened as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from tests import run_tools
from tests.fake_billing import FakeBilling, use_service
from tests.run_tools import ARGS, ScriptedModel, runs_billing
from toolledger import Ledger, RunSuperseded
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.runs import AgentRun, FinalAnswer, ToolCallRequest


async def main(args: argparse.Namespace) -> None:
    use_service(FakeBilling(Path(args.service)))
    ledger = await Ledger.connect(run_projector=False)
    agent = AgentConfig(name="billing-assistant")
    try:
        if args.mode == "crash":
            run_tools.behaviour["charge"] = "effect_then_hang"
            run_tools.hang_marker["path"] = args.ready
            model = ScriptedModel(
                [ToolCallRequest("c1", "runs.charge_patiently", ARGS)], FinalAnswer("x")
            )
            run = AgentRun(
                ledger,
                run_id=args.run,
                tenant_id="acme",
                agent=agent,
                tools=runs_billing,
                model=model,
            )
            await run.start("charge me")
            return
        model = ScriptedModel(
            [ToolCallRequest(args.call, "runs.charge", ARGS)], FinalAnswer(args.call)
        )
        run = AgentRun(
            ledger, run_id=args.run, tenant_id="acme", agent=agent, tools=runs_billing, model=model
        )
        Path(args.ready).write_text("ready")
        give_up = time.monotonic() + 20
        while not Path(args.go).exists():
            if time.monotonic() > give_up:
                raise SystemExit("the test never said go")
            await asyncio.sleep(0.002)
        try:
            result = await run.resume()
            print(json.dumps({"status": result.status, "answer": result.answer}), flush=True)
        except RunSuperseded as exc:
            print(json.dumps({"status": "superseded", "detail": str(exc)}), flush=True)
    finally:
        await ledger.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["crash", "resume"])
    parser.add_argument("--run", required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--go", default="")
    parser.add_argument("--call", default="c2")
    asyncio.run(main(parser.parse_args()))
