"""A system's figures in sixths of the run: do they hold from the first step to the last?

A benchmark's medians hide a system that slows down as it runs: the leader's figures once fell
by half from the first repetition to the last, because the local broker's fetches grew with
the partition's length (BENCHMARKS.md, issue 25, nineteenth session). So the peers benchmark
also cuts the leader's run into six equal stretches and reports each (issue 46: the sixths
should stay within 20% of each other):

- **serial p50**: the run's serial steps, every round's in order, cut into six groups of
  consecutive steps;
- **64-way rate and CPU per step**: the concurrent phases, laid end to end, cut into six
  equal stretches of time. While a phase runs (and while the system settles after it),
  `traced` samples every `SAMPLE_S` the steps completed so far and each part's CPU seconds
  (from /proc, for the pids found at the phase's start); a stretch's rate is its steps over
  its time, its CPU per step its CPU over its steps, both read off the samples on each side.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from benchmarks._runtime import process_cpu_seconds

#: Seconds between two samples of a concurrent phase.
SAMPLE_S = 0.2
#: How far apart the sixths may be, as max / min - 1, for the figures to count as holding.
SPREAD_GOAL = 0.20

T = TypeVar("T")


@dataclass
class Trace:
    """Samples of one concurrent phase: (seconds since its start, steps done, CPU by part)."""

    samples: list[tuple[float, float, float]] = field(default_factory=list)


async def traced(
    work: Awaitable[T], done: Callable[[], int], pids: Mapping[str, Collection[int]]
) -> tuple[T, Trace]:
    """Await `work`, sampling `done()` and the total CPU of `pids` meanwhile (and at both ends)."""
    trace = Trace()
    started = time.monotonic()
    first = done()

    def sample() -> None:
        cpu = sum(process_cpu_seconds(pid) or 0.0 for pids_ in pids.values() for pid in pids_)
        trace.samples.append((time.monotonic() - started, done() - first, cpu))

    async def sampler() -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            sample()

    sample()
    task = asyncio.create_task(sampler())
    try:
        result = await work
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    sample()
    return result, trace


@dataclass(frozen=True)
class Sixth:
    """One sixth of a run: serial p50 (s), concurrent rate (steps/s) and CPU per step (s)."""

    p50: float
    rate: float
    cpu: float


def _at(samples: Sequence[tuple[float, float, float]], t: float) -> tuple[float, float]:
    """Steps and CPU at time `t` of a laid-end-to-end timeline, interpolated linearly."""
    previous = samples[0]
    for sample in samples:
        if sample[0] >= t:
            span = sample[0] - previous[0]
            share = 0.0 if span <= 0 else (t - previous[0]) / span
            return (
                previous[1] + share * (sample[1] - previous[1]),
                previous[2] + share * (sample[2] - previous[2]),
            )
        previous = sample
    return previous[1], previous[2]


def sixths(
    serial: Sequence[Sequence[float]],
    traces: Sequence[Trace],
    p50: Callable[[Sequence[float]], float],
) -> list[Sixth]:
    """The run's six stretches (see the module docstring); fewer than six steps give none."""
    steps = [t for times in serial for t in times]
    timeline: list[tuple[float, float, float]] = []
    offset, steps_before, cpu_before = 0.0, 0.0, 0.0
    for trace in traces:
        if not trace.samples:
            continue
        base = trace.samples[0]
        for at, done, cpu in trace.samples:
            timeline.append((offset + at, steps_before + done, cpu_before + cpu - base[2]))
        offset, steps_before, cpu_before = timeline[-1]
    if len(steps) < 6 or len(timeline) < 2:
        return []
    out = []
    for i in range(6):
        group = steps[i * len(steps) // 6 : (i + 1) * len(steps) // 6]
        start, end = _at(timeline, offset * i / 6), _at(timeline, offset * (i + 1) / 6)
        done, cpu = end[0] - start[0], end[1] - start[1]
        out.append(Sixth(p50(group), done / (offset / 6), cpu / done if done else 0.0))
    return out


def render(name: str, parts: Sequence[Sixth]) -> list[str]:
    """The sixths as lines of the report, each figure's spread against `SPREAD_GOAL`."""
    if not parts:
        return []

    def spread(values: list[float]) -> str:
        low, high = min(values), max(values)
        value = high / low - 1 if low > 0 else float("inf")
        held = "holds" if value <= SPREAD_GOAL else "does not hold"
        return f"spread {value:.0%} ({held}: goal <= {SPREAD_GOAL:.0%})"

    p50 = [s.p50 * 1000 for s in parts]
    rate = [s.rate for s in parts]
    cpu = [s.cpu * 1e6 for s in parts]
    return [
        "",
        f"{name} in sixths of the run (first to last):",
        f"  serial p50: {', '.join(f'{v:.2f}' for v in p50)} ms; {spread(p50)}",
        f"  64-way rate: {', '.join(f'{v:,.0f}' for v in rate)} steps/s; {spread(rate)}",
        f"  CPU per step: {', '.join(f'{v:,.0f}' for v in cpu)} µs; {spread(cpu)}",
    ]
