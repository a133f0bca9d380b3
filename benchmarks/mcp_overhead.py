"""The MCP adapter's own cost per call, against a bare `ledger.call` of the same tool.

`python -m benchmarks.mcp_overhead [--samples N] [--repeat R]`: on the memory ledger (the
adapter's cost is what is measured, so no service's round trip should drown it), the no-op
`external()` tool of the runtime benchmarks is called on a new key each time four ways,
interleaved so all of them see the machine at the same moments:

- **bare**: `ledger.call(noop, run_id=..., tool_call_id=...)`, the floor;
- **shared**: `toolledger.integrations._calls.make_call`, what every adapter does per call (the
  key's record read, the duplicate-intent query, `ledger.call`), a diagnostic;
- **adapter**: `LedgerMCPServer.call(name, arguments, meta)`, the server's handler without any
  transport: key from `_meta`, the model-facing name, the shared `make_call` (its record read
  and its duplicate-intent query) and the result built for the client;
- **client**: `call_tool_keyed` through an in-process `mcp.Client` (the SDK's direct dispatcher,
  no JSON-RPC framing), which is what an agent embedding the server pays.

Each sample makes one call each way, starting with another way each time (a call pays for the
projector folding the previous call's outcome, so no way may always follow the same one). Wall
time and this process's CPU time (`time.process_time`; the in-process projector's work is in it
for every way alike) are both reported: under load the wall clock mostly measures the queue for
a core. Runs hold 10 calls each (the duplicate-intent guard lists a run's calls of the tool, so a
run's size is part of the cost; agent runs are that small). Every call must have run the tool
once and returned its value. Figures are medians of per-repetition medians; ratios are against
bare.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable

import mcp.types as types
from mcp import Client

from benchmarks._runtime import RUNS, bench, noop
from benchmarks._support import median, percentile, say
from toolledger import Ledger
from toolledger.integrations._calls import Answer, make_call
from toolledger.integrations._common import AdapterOptions, CallKey
from toolledger.integrations.mcp import LedgerMCPServer, call_tool_keyed

CALLS_PER_RUN = 10
WARMUP = 200
NAME = "bench__noop"


Samples = dict[str, dict[str, list[float]]]


async def measure(samples: int, repeat: int) -> Samples:
    """Per way (`bare`, `shared`, `adapter`, `client`) and clock (`wall`, `cpu`), the median
    seconds per call of each repetition."""
    medians: Samples = {
        way: {"wall": [], "cpu": []} for way in ("bare", "shared", "adapter", "client")
    }
    async with await Ledger.memory() as ledger:
        server = LedgerMCPServer(ledger, bench, tenant_id="bench")
        async with Client(server.server) as client:
            counter = iter(range(10**9))

            async def bare(n: int) -> None:
                outcome = await ledger.call(
                    noop, run_id=_run("b", n), tool_call_id=f"c{n}", tenant_id="bench",
                    arguments={"n": n},
                )  # fmt: skip
                if outcome.value != n:
                    raise RuntimeError(f"bare call {n} returned {outcome.value!r}")

            async def shared(n: int) -> None:
                key = CallKey(_run("s", n), f"c{n}")
                answer = await make_call(
                    ledger, noop, key, tenant_id="bench", arguments={"n": n},
                    options=AdapterOptions(),
                )  # fmt: skip
                if not isinstance(answer, Answer) or answer.value != n:
                    raise RuntimeError(f"make_call {n} returned {answer!r}")

            async def adapter(n: int) -> None:
                meta = {
                    "dev.toolledger/run-id": _run("a", n),
                    "dev.toolledger/tool-call-id": f"c{n}",
                }
                _check(await server.call(NAME, {"n": n}, meta), n)

            async def through_client(n: int) -> None:
                result = await call_tool_keyed(
                    client, NAME, {"n": n}, run_id=_run("m", n), tool_call_id=f"c{n}"
                )
                _check(result, n)

            ways: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
                ("bare", bare), ("shared", shared), ("adapter", adapter),
                ("client", through_client),
            ]  # fmt: skip
            for _ in range(WARMUP):
                for _, way in ways:
                    await way(next(counter))
            for rep in range(repeat):
                wall: dict[str, list[float]] = {name: [] for name, _ in ways}
                cpu: dict[str, list[float]] = {name: [] for name, _ in ways}
                gc.collect()
                for i in range(samples):
                    # Each sample starts with another way, so none always follows the same one.
                    for name, way in ways[i % len(ways) :] + ways[: i % len(ways)]:
                        n = next(counter)
                        started, started_cpu = time.perf_counter(), time.process_time()
                        await way(n)
                        cpu[name].append(time.process_time() - started_cpu)
                        wall[name].append(time.perf_counter() - started)
                for name, _ in ways:
                    medians[name]["wall"].append(percentile(wall[name], 50))
                    medians[name]["cpu"].append(percentile(cpu[name], 50))
                say(
                    f"  mcp overhead {rep + 1}/{repeat}: "
                    + ", ".join(
                        f"{k} p50 {percentile(wall[k], 50) * 1e6:.0f} us wall, "
                        f"{percentile(cpu[k], 50) * 1e6:.0f} us cpu"
                        for k in wall
                    )
                )
    expected = (WARMUP + samples * repeat) * 4
    if RUNS["noop"] != expected:
        raise RuntimeError(f"the no-op tool ran {RUNS['noop']} times, not {expected}")
    return medians


def _run(prefix: str, n: int) -> str:
    return f"{prefix}{n // (CALLS_PER_RUN * 4)}"


def _check(result: types.CallToolResult, n: int) -> None:
    said = [c.text for c in result.content if isinstance(c, types.TextContent)]
    if result.is_error or said != [str(n)]:
        raise RuntimeError(f"call {n} returned {result!r}")


def report(medians: Samples) -> str:
    lines = []
    for clock in ("wall", "cpu"):
        bare = median(medians["bare"][clock])
        lines.append(f"{clock:>4}  bare ledger.call       p50 {bare * 1e6:7.0f} us  (floor)")
        for name, label in (
            ("shared", "make_call (shared)"),
            ("adapter", "MCP handler"),
            ("client", "in-process mcp.Client"),
        ):
            value = median(medians[name][clock])
            lines.append(
                f"{clock:>4}  {label:<22} p50 {value * 1e6:7.0f} us  {value / bare:.2f}x  "
                f"(+{(value - bare) * 1e6:.0f} us)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mcp_overhead", description=__doc__)
    parser.add_argument("--samples", type=int, default=500, help="calls per way per repetition")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (medians reported)")
    args = parser.parse_args(argv)
    print(report(asyncio.run(measure(args.samples, args.repeat))))


if __name__ == "__main__":
    main()
