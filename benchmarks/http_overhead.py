"""What `toolledger.http` costs a request: client CPU per call, against bare httpx, in one run.

    python -m benchmarks.http_overhead [--repeat 7] [--calls 2000]

The same request, `GET /v1/charges/ch_1` with an `Idempotency-Key` header, to the fake payments
API (`examples.http_refund.payments`) on a loopback port, two ways:

- `httpx`: a bare `httpx.AsyncClient.get(..., headers={"Idempotency-Key": key})`, the floor:
  what a hand-written tool does at the least;
- `toolledger.http`: `ToolHTTP.get(..., context=context)`, a new `ToolContext` per call (the
  runtime makes one per attempt), so the figure is everything the helper adds: the header, the
  trace hook httpcore calls at each stage of the request, the sending mark, the evidence line
  and the classification of the answer.

The server runs in a child process, so `time.process_time()` measures the client alone (its
event loop, httpx, httpcore and the helper). Each repetition runs both variants for `--calls`
calls after a warm-up, in alternating order, on one kept-alive connection each; the table shows
the median CPU per call of each and the helper's added share of the floor. No ledger is
involved: `Ledger.call`'s own cost is benchmarks/runtime_overhead.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 200
PATH = "/v1/charges/ch_1"
VARIANTS = ("httpx", "toolledger.http")


async def _serve() -> None:
    from examples.http_refund.payments import FakePayments

    async with FakePayments() as api:
        print(api.port, flush=True)
        await asyncio.Event().wait()


async def _bare(url: str, calls: int) -> float:
    import httpx

    async with httpx.AsyncClient(base_url=url) as client:
        for n in range(WARMUP):
            (await client.get(PATH, headers={"Idempotency-Key": f"w{n}:c1"})).raise_for_status()
        started = time.process_time()
        for n in range(calls):
            answer = await client.get(PATH, headers={"Idempotency-Key": f"r{n}:c1"})
            answer.raise_for_status()
        return (time.process_time() - started) / calls


async def _helper(url: str, calls: int) -> float:
    from toolledger.http import ToolHTTP
    from toolledger.testing import fake_tool_context

    async with ToolHTTP(base_url=url) as client:
        for n in range(WARMUP):
            await client.get(PATH, context=fake_tool_context(run_id=f"w{n}"))
        started = time.process_time()
        for n in range(calls):
            await client.get(PATH, context=fake_tool_context(run_id=f"r{n}"))
        return (time.process_time() - started) / calls


def _server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.http_overhead", "--serve"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        raise RuntimeError(f"the fake payments server did not start (said {port!r})")
    return proc, f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_overhead")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve())
        return
    proc, url = _server()
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for rep in range(args.repeat):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                run = _bare if variant == "httpx" else _helper
                samples[variant].append(asyncio.run(run(url, args.calls)) * 1e6)
            line = ", ".join(f"{v} {samples[v][-1]:.1f}" for v in VARIANTS)
            print(f"  repetition {rep + 1}/{args.repeat}: CPU us per call: {line}", flush=True)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)
    floor = statistics.median(samples["httpx"])
    helper = statistics.median(samples["toolledger.http"])
    added = [h - b for h, b in zip(samples["toolledger.http"], samples["httpx"], strict=True)]
    print(f"\nclient CPU per request, median of {args.repeat} x {args.calls} requests")
    print(f"{'variant':<16} {'us/call':>9} {'vs httpx':>9}")
    for variant, value in (("httpx", floor), ("toolledger.http", helper)):
        print(f"{variant:<16} {value:>9.1f} {value / floor:>8.3f}x")
    median_added = statistics.median(added)
    print(
        f"added by the helper: {median_added:.1f} us per request (median of the paired "
        f"differences), {median_added / floor:.1%} of the bare request"
    )


if __name__ == "__main__":
    main()
