"""A tiny run of every benchmark of `make bench`, so that their self-checks run in CI.

Each benchmark checks its own work and raises when it did not do what it measured: every
reservation of the latency benchmark accepted, the rows behind catch-up's offsets, replay's
event count, the overhead and throughput benchmarks' tool runs and ledger books, the fast path's
untouched history. This test runs them all at the smallest sizes their command allows, against
the dev stack, and asserts that each completed and reported its rows. It asserts nothing about
speed: a tiny run on a shared machine says nothing about it (BENCHMARKS.md has the figures).

The peers benchmark (`make bench-peers`) is not run here: it needs Restate and DBOS installed
under `.toolledger/peers`, which `make test` does not install.
"""

from __future__ import annotations

import pytest

from benchmarks import ledger_growth
from benchmarks.__main__ import _arguments, _run
from toolledger.devstack import Services

TINY = [
    "--events", "2000",
    "--repeat", "1",
    "--samples", "10",
    "--partitions", "2",
    # Catch-up needs several commits to read a rate from: small batches make enough of them.
    "--batch-size", "20",
    "--budget", "30",
    "--runs", "4",
    "--calls", "3",
    "--idle-seconds", "1",
    "--idle-calls", "1",
]  # fmt: skip


@pytest.mark.timeout(900)
async def test_every_benchmark_completes_a_tiny_run_with_its_self_checks(
    dev_services: Services,
) -> None:
    """A benchmark whose self-check fails (a rejected reservation, offsets without rows, a tool
    run missing or doubled, a memory-ledger key not completed, books that do not add up)
    raises, and fails this test."""
    rows = await _run(dev_services, _arguments(TINY))
    reported = {(r.benchmark, r.metric) for r in rows}
    expected = {
        ("verdict latency (in-process)", "p50"),
        ("verdict latency (process)", "p50"),
        ("replay", "replay + digest"),
        ("replay", "in memory, 1 process"),
        ("replay", "in memory, 2 processes"),
        ("call overhead (external, no-op)", "p50"),
        ("read barrier (key read)", "caught up, p50"),
        ("read barrier (key read)", "right after a leader's answer, p50"),
        ("read barrier (a run's calls)", "caught up, p50"),
        ("throughput (4 runs)", "calls/s"),
        ("throughput (4 runs)", "no facts (diag.)"),
        ("memory ledger call (external, no-op)", "CPU per call"),
        ("idle CPU (direct)", "all"),
        ("idle CPU (fast path)", "call after 2 s idle, p50"),
    }
    assert expected <= reported, sorted(reported)
    assert sum(1 for r in rows if r.benchmark == "catch-up") == 4, sorted(reported)
    assert any(r.benchmark.startswith("fast-path") for r in rows), sorted(reported)
    # An idle process may burn less than a clock tick (10 ms) in a second: 0 ms/s is a reading.
    measured = [r for r in rows if not (r.benchmark.startswith("idle CPU") and r.unit == "ms/s")]
    assert all(r.value > 0 for r in measured), [r for r in measured if r.value <= 0]


async def test_the_ledger_growth_benchmark_completes_a_tiny_run_with_its_books(
    dev_services: Services,
) -> None:
    """Two rounds into one ledger; its book check (every call completed once, two history
    entries each) raises if the rounds did not do what they measured."""
    rows = await ledger_growth.measure(dev_services, rounds=2, runs=3, calls=2)
    [row] = rows
    assert row.value > 0 and row.floor is not None and row.floor > 0
    assert "2 rounds of 3 runs x 2 calls" in row.note
