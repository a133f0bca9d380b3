"""What tracing costs a call: `Ledger.memory()` CPU per call, untraced, no-op and with an SDK.

    python -m benchmarks.tracing_overhead [--baseline REV] [--repeat 5] [--calls 2000]

Three variants of the same loop (a no-op external tool, a new key per call, on the embedded
ledger, whose projector runs in the same process, so its batch spans are counted too):

- `baseline`: the package as it was at `REV` (default: the commit before spans were added),
  exported with `git archive` into a temporary folder and put first on `PYTHONPATH`;
- `no-op`: this tree with no SDK configured, what every user gets by default;
- `sdk`: this tree under the SDK's `TracerProvider` with a `BatchSpanProcessor` whose exporter
  drops what it gets, so the figure is the spans' creation and processing, not an exporter's.

Each variant runs in its own process (the global tracer provider can be set once per process),
and measures `time.process_time()` (CPU of every thread, the batch processor's included) over
`--calls` calls after a warm-up. Variants are interleaved per repetition, in a rotating order, so
they see the same machine, and the table shows the median per-call CPU of each and its ratio to
the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks._baseline import export_tree

ROOT = Path(__file__).resolve().parent.parent
#: The last commit before `Ledger.call` had spans.
DEFAULT_BASELINE = "934c0de"
WARMUP = 300
VARIANTS = ("baseline", "no-op", "sdk")


async def _measure(calls: int) -> float:
    """CPU seconds per call of the no-op tool on a memory ledger."""
    from benchmarks._runtime import noop
    from toolledger import Ledger

    async with await Ledger.memory() as ledger:
        for n in range(WARMUP):
            await ledger.call(
                noop, run_id=f"w{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
            )
        started = time.process_time()
        for n in range(calls):
            await ledger.call(
                noop, run_id=f"r{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
            )
        return (time.process_time() - started) / calls


def _install_sdk() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


def _child(variant: str, calls: int) -> None:
    if variant == "sdk":
        _install_sdk()
    import toolledger

    per_call = asyncio.run(_measure(calls))
    print(json.dumps({"variant": variant, "cpu_us": per_call * 1e6, "from": toolledger.__file__}))


def _run(variant: str, calls: int, baseline: Path) -> float:
    env = dict(os.environ)
    env.pop("OTEL_TRACES_EXPORTER", None)
    if variant == "baseline":
        env["PYTHONPATH"] = os.pathsep.join([str(baseline), str(ROOT)])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.tracing_overhead",
            "--child",
            variant,
            "--calls",
            str(calls),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=baseline if variant == "baseline" else ROOT,  # `-m` puts the cwd first on the path
        env=env,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    expected_root = baseline if variant == "baseline" else ROOT
    if not result["from"].startswith(str(expected_root)):
        raise RuntimeError(f"{variant} imported toolledger from {result['from']}")
    return float(result["cpu_us"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing_overhead")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare to")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.calls)
        return
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="toolledger-baseline-") as tmp:
        baseline = export_tree(args.baseline, Path(tmp))
        for rep in range(args.repeat):
            # Rotated, so a machine that gets busier during a repetition favours none of them.
            for variant in VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]:
                samples[variant].append(_run(variant, args.calls, baseline))
            line = ", ".join(f"{v} {samples[v][-1]:.1f}" for v in VARIANTS)
            print(f"  repetition {rep + 1}/{args.repeat}: CPU us per call: {line}", flush=True)
    base = statistics.median(samples["baseline"])
    print(f"\nLedger.memory() CPU per call, median of {args.repeat} x {args.calls} calls")
    print(f"{'variant':<10} {'us/call':>9} {'vs baseline':>12}")
    for variant in VARIANTS:
        value = statistics.median(samples[variant])
        print(f"{variant:<10} {value:>9.1f} {value / base:>11.3f}x")


if __name__ == "__main__":
    main()
