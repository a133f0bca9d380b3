"""One framework run in its own OS process, for the tests that kill or race real processes.

`python -m tests.integrations.worker FRAMEWORK start|resume --thread T --store DIR --tool NAME
--service DB [--go FILE]` connects to the ledger from the `TOOLLEDGER_*` environment, starts
(or resumes, from the framework's persistence in DIR) the refund run of thread T, and writes
what happened to `DIR/result-<pid>.json`. With `--go` it waits for that file first, so two
workers can be released at one instant. `TEST_CREDIT_BEHAVIOUR=effect_then_hang` makes the
credit hang after its effect, writing `TEST_HANG_MARKER`, until the test kills the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from tests.fake_billing import FakeBilling, use_service
from tests.integrations.drivers import driver
from toolledger import Ledger


async def main(args: argparse.Namespace) -> None:
    use_service(FakeBilling(Path(args.service)))
    store = Path(args.store)
    async with await Ledger.connect(run_projector=False) as ledger:
        run = driver(args.framework, ledger, tool=args.tool, store=store)
        if args.go:
            give_up = time.monotonic() + 30
            while not Path(args.go).exists():
                if time.monotonic() > give_up:
                    raise SystemExit("the test never said go")
                await asyncio.sleep(0.002)
        step = await (run.start(args.thread) if args.mode == "start" else run.resume(args.thread))
    result = {"step": asdict(step), "heard": run.heard}
    (store / f"result-{os.getpid()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("framework")
    parser.add_argument("mode", choices=["start", "resume"])
    parser.add_argument("--thread", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--tool", default="billing__issue_credit")
    parser.add_argument("--service", required=True)
    parser.add_argument("--go", default="")
    asyncio.run(main(parser.parse_args()))
