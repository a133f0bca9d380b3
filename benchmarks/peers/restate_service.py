"""The Restate side of `python -m benchmarks.peers`: one service whose handlers take durable steps.

Runs in the peers' own environment (`.toolledger/peers/venv`, see `make bench-peers`), served
by hypercorn and registered with a `restate-server` started by the benchmark. Each step is a
`ctx.run_typed` of a no-op coroutine, the counterpart of toolledger's no-op external tool: the
SDK runs it, proposes its result to the server and returns once the server acknowledged the
journal entry, so a step costs what Restate makes durable per step (one record after it ran).

- `serial(n)`: `n` steps in one invocation, each timed from the call to the acknowledged result
  (the same span as a `Ledger.call` of the no-op tool); returns the step times in seconds.
- `steps(n)`: `n` steps in sequence, returning how many ran, for the concurrent rounds.

A step counter per process lets the benchmark check that every step it asked for ran once.
"""

from __future__ import annotations

import asyncio
import sys
import time

import hypercorn.asyncio
import hypercorn.config
import restate

bench = restate.Service("Bench")
#: How many times the no-op step ran in this process (the benchmark reads it through `ran`).
RAN = {"steps": 0}


async def noop(n: int) -> int:
    """The step: no effect, returns its argument."""
    RAN["steps"] += 1
    return n


@bench.handler()
async def serial(ctx: restate.Context, n: int) -> list[float]:
    times: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        value = await ctx.run_typed(f"step-{i}", noop, n=i)
        times.append(time.perf_counter() - started)
        if value != i:
            raise restate.TerminalError(f"step {i} returned {value}")
    return times


@bench.handler()
async def steps(ctx: restate.Context, n: int) -> int:
    done = 0
    for i in range(n):
        if await ctx.run_typed(f"step-{i}", noop, n=i) != i:
            raise restate.TerminalError(f"step {i} returned the wrong value")
        done += 1
    return done


@bench.handler()
async def ran(ctx: restate.Context) -> int:
    """How many steps ran in this process so far (not journaled: a diagnostic read)."""
    return RAN["steps"]


app = restate.app(services=[bench])


async def _serve(port: int) -> None:
    """One hypercorn process (no worker processes): its CPU time is the SDK's."""
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.h2_max_concurrent_streams = 2**31 - 1
    config.keep_alive_timeout = 3600
    config.keep_alive_max_requests = 2**31 - 1
    config.accesslog = None
    await hypercorn.asyncio.serve(app, config)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
