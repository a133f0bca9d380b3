"""The DBOS side of `python -m benchmarks.peers`: workflows of durable steps, driven over stdin.

Runs in the peers' own environment (`.toolledger/peers/venv`, see `make bench-peers`), as a
process of its own: DBOS is a library, so this process is at once DBOS's runtime and its client,
with its system database in the local PostgreSQL (a database of its own, named on the command
line, which the benchmark drops afterwards). Each step is an `@DBOS.step()` no-op coroutine, the
counterpart of toolledger's no-op external tool; DBOS checks the step's slot in
`operation_outputs` before it runs and records its output after, so a step costs what DBOS makes
durable per step (one record after it ran).

The benchmark writes one JSON command per line and reads one JSON answer per line:

- `{"op": "serial", "n": N}`: one workflow of `N` steps, each timed from the call to its
  recorded result (the span of a `Ledger.call` of the no-op tool); answers `{"times": [...]}`.
- `{"op": "concurrent", "runs": R, "calls": C}`: `R` workflows at once, `C` steps each;
  answers `{"elapsed": seconds, "steps": steps that ran}`.
- `{"op": "stop"}`: shut DBOS down and exit.

Every answer carries `ran`, the steps run so far in this process, so the benchmark checks that
every step it asked for ran exactly once.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from dbos import DBOS

RAN = {"steps": 0}


@DBOS.step()
async def noop(n: int) -> int:
    """The step: no effect, returns its argument."""
    RAN["steps"] += 1
    return n


@DBOS.workflow()
async def serial(n: int) -> list[float]:
    times: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        value = await noop(i)
        times.append(time.perf_counter() - started)
        if value != i:
            raise RuntimeError(f"step {i} returned {value}")
    return times


@DBOS.workflow()
async def steps(n: int) -> int:
    done = 0
    for i in range(n):
        if await noop(i) != i:
            raise RuntimeError(f"step {i} returned the wrong value")
        done += 1
    return done


async def _answer(command: dict[str, Any]) -> dict[str, Any]:
    if command["op"] == "serial":
        handle = await DBOS.start_workflow_async(serial, int(command["n"]))
        return {"times": await handle.get_result()}
    if command["op"] == "concurrent":
        started = time.perf_counter()
        handles = await asyncio.gather(
            *(
                DBOS.start_workflow_async(steps, int(command["calls"]))
                for _ in range(command["runs"])
            )
        )
        done = await asyncio.gather(*(h.get_result() for h in handles))
        return {"elapsed": time.perf_counter() - started, "steps": sum(done)}
    raise ValueError(f"unknown command {command!r}")


async def main(database_url: str) -> None:
    DBOS(
        config={
            "name": "toolledger-peers",
            "system_database_url": database_url,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    loop = asyncio.get_running_loop()
    try:
        print(json.dumps({"ready": True, "ran": 0}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            if command["op"] == "stop":
                break
            answer = await _answer(command)
            print(json.dumps({**answer, "ran": RAN["steps"]}), flush=True)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
