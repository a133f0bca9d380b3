"""What `toolledger.http` costs a request: client CPU per call, against bare httpx, in one run.

    python -m benchmarks.http_overhead [--repeat 5] [--blocks 40] [--calls 50]

The same request, `GET /v1/charges/ch_1` with an `Idempotency-Key` header, to the fake payments
API (`toolledger.http.fake`) on a loopback port, two ways:

- `httpx`: a bare `httpx.AsyncClient.get(..., headers={"Idempotency-Key": key})`, the floor:
  what a hand-written tool does at the least;
- `toolledger.http`: `ToolHTTP.get(..., context=context)`, a new `ToolContext` per call (the
  runtime makes one per attempt), so the figure is everything the helper adds: the header, the
  trace hook httpcore calls at each stage of the request, the sending mark, the evidence line
  and the classification of the answer.

The server runs in a child process, so `time.process_time()` measures the client alone (its
event loop, httpx, httpcore, the kernel's socket calls and the helper). Both clients live in one
event loop, each on one kept-alive connection; each repetition (a fresh loop) runs `--blocks`
pairs of blocks of `--calls` requests after a warm-up, alternating which variant goes first, so
that the two blocks of a pair see the same machine. On a shared machine a request's CPU moves
by a quarter from one second to the next; the added cost is therefore the median of the paired
differences, and the table shows it beside the medians of each variant. No ledger is
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
    from toolledger.http.fake import FakePayments

    async with FakePayments() as api:
        print(api.port, flush=True)
        await asyncio.Event().wait()


async def _blocks(url: str, blocks: int, calls: int) -> dict[str, list[float]]:
    """CPU microseconds per request of each variant, one figure per block of `calls`."""
    import httpx

    from toolledger.http import ToolHTTP
    from toolledger.testing import fake_tool_context

    async with httpx.AsyncClient(base_url=url) as bare, ToolHTTP(base_url=url) as helper:

        async def floor(n: int) -> None:
            (await bare.get(PATH, headers={"Idempotency-Key": f"r{n}:c1"})).raise_for_status()

        async def ours(n: int) -> None:
            await helper.get(PATH, context=fake_tool_context(run_id=f"r{n}"))

        runs = {"httpx": floor, "toolledger.http": ours}
        for n in range(WARMUP):
            await floor(n)
            await ours(n)
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for block in range(blocks):
            order = VARIANTS if block % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                run = runs[variant]
                started = time.process_time()
                for n in range(calls):
                    await run(n)
                samples[variant].append((time.process_time() - started) / calls * 1e6)
        return samples


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
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=40, help="block pairs per repetition")
    parser.add_argument("--calls", type=int, default=50, help="requests per block")
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
            got = asyncio.run(_blocks(url, args.blocks, args.calls))
            for variant in VARIANTS:
                samples[variant].extend(got[variant])
            line = ", ".join(f"{v} {statistics.median(got[v]):.1f}" for v in VARIANTS)
            print(f"  repetition {rep + 1}/{args.repeat}: CPU us per call: {line}", flush=True)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)
    floor = statistics.median(samples["httpx"])
    helper = statistics.median(samples["toolledger.http"])
    added = [h - b for h, b in zip(samples["toolledger.http"], samples["httpx"], strict=True)]
    total = args.repeat * args.blocks
    print(f"\nclient CPU per request, median of {total} blocks of {args.calls} requests each")
    print(f"{'variant':<16} {'us/call':>9} {'vs httpx':>9}")
    for variant, value in (("httpx", floor), ("toolledger.http", helper)):
        print(f"{variant:<16} {value:>9.1f} {value / floor:>8.3f}x")
    median_added = statistics.median(added)
    print(
        f"added by the helper: {median_added:.1f} us per request (median of the "
        f"{len(added)} paired block differences), {median_added / floor:.1%} of the bare request"
    )


if __name__ == "__main__":
    main()
