"""What the read barrier costs a key read (`toolledger.projections.barrier`).

A read outside the projector (the API, the console, the CLI, a processor) first learns where
the partitions it covers end and waits until the projection committed that far. Two rows, each
against the same key read without the barrier (`LedgerStore.get_call`, a pooled primary-key
read), measured alternately in the same run:

- **caught up**: a key's read on a ledger with nothing in flight, the usual read of a console:
  the barrier's look (the broker's high watermark, the leader's read index and the committed
  positions, read at once) beside the leader's record of the key from memory.
- **right after a leader's answer**: a call made on the fast path, then at once the read of
  its key, answered from the leader's memory once its end reaches the partition's (else it
  would wait for the projection's commit, which lingers behind a leader's answers).
- **a run's calls**: a list bounded to one run (no memory answers a list), caught up: the
  look, then the query; against the same query alone.

It also reports how many looks 64 concurrent reads cost (one serves every reader asked while
the previous one was in flight). Every read is checked: a caught-up read finds its completed
key, and a read after an answer finds the call completed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from benchmarks._runtime import RunningLedger, noop, running_ledger
from benchmarks._support import Row, Scratch, median, percentile, say
from toolledger.events.records import CallRecord
from toolledger.port import CallQuery

KEYS = 100
WARMUP = 30
CONCURRENT = 64


async def _timed(read: Awaitable[CallRecord | None]) -> tuple[float, CallRecord | None]:
    started = time.perf_counter()
    found = await read
    return time.perf_counter() - started, found


def _completed(found: CallRecord | None, key: str) -> None:
    if found is None or found.status != "completed":
        raise RuntimeError(f"{key}: the read found {found!r}, not its completed call")


async def _caught_up(running: RunningLedger, n: int) -> tuple[float, float]:
    """(with the barrier, without) for one completed key."""
    key = f"rb{n % KEYS}:c1"
    reads = running.stack.reads
    fenced, found = await _timed(reads.get_call(key))
    _completed(found, key)
    bare, found = await _timed(reads.store.get_call(key))
    _completed(found, key)
    return fenced, bare


async def _after_answer(running: RunningLedger, n: int) -> tuple[float, float]:
    """(the fresh read right after a fast-path call, a bare read of a completed key)."""
    assert running.fast is not None
    await running.fast.call(
        noop, run_id=f"ra{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
    )
    fenced, found = await _timed(running.stack.reads.get_call(f"ra{n}:c1"))
    _completed(found, f"ra{n}:c1")
    bare, found = await _timed(running.stack.reads.store.get_call(f"rb{n % KEYS}:c1"))
    _completed(found, f"rb{n % KEYS}:c1")
    return fenced, bare


async def _run_calls(running: RunningLedger, n: int) -> tuple[float, float]:
    """(the calls of one run through the barrier, the same query alone)."""
    query = CallQuery(tenant_id=None, run_id=f"rb{n % KEYS}")
    started = time.perf_counter()
    fenced = await running.stack.reads.list_calls(query)
    middle = time.perf_counter()
    bare = await running.stack.reads.store.list_calls(query)
    ended = time.perf_counter()
    if len(fenced) != 1 or len(bare) != 1:
        raise RuntimeError(f"rb{n % KEYS} lists {len(fenced)} and {len(bare)} calls, not 1")
    return middle - started, ended - middle


async def _looks_per_read(running: RunningLedger) -> float:
    barrier = running.stack.reads.barrier
    before = barrier.looks
    keys = [f"rb{n % KEYS}:c1" for n in range(CONCURRENT)]
    for found, key in zip(
        await asyncio.gather(*(running.stack.reads.get_call(k) for k in keys)), keys, strict=True
    ):
        _completed(found, key)
    return (barrier.looks - before) / CONCURRENT


async def measure(scratch: Scratch, *, samples: int, repeat: int) -> list[Row]:
    async with running_ledger(scratch, "barrier") as running:
        for n in range(KEYS):
            await running.ledger.call(
                noop, run_id=f"rb{n}", tool_call_id="c1", tenant_id="bench", arguments={"n": n}
            )
        for n in range(WARMUP):
            await _caught_up(running, n)
        caught: list[tuple[list[float], list[float]]] = []
        after: list[tuple[list[float], list[float]]] = []
        lists: list[tuple[list[float], list[float]]] = []
        looks: list[float] = []
        for rep in range(repeat):
            pairs = [await _caught_up(running, n) for n in range(samples)]
            caught.append(([p[0] for p in pairs], [p[1] for p in pairs]))
            pairs = [await _after_answer(running, rep * samples + n) for n in range(samples)]
            after.append(([p[0] for p in pairs], [p[1] for p in pairs]))
            pairs = [await _run_calls(running, n) for n in range(samples)]
            lists.append(([p[0] for p in pairs], [p[1] for p in pairs]))
            looks.append(await _looks_per_read(running))
            say(
                f"  read barrier {rep + 1}/{repeat}: caught up p50 "
                f"{percentile(caught[-1][0], 50) * 1000:.3f} ms vs "
                f"{percentile(caught[-1][1], 50) * 1000:.3f} ms bare; after an answer "
                f"{percentile(after[-1][0], 50) * 1000:.3f} ms; a run's calls "
                f"{percentile(lists[-1][0], 50) * 1000:.3f} ms vs "
                f"{percentile(lists[-1][1], 50) * 1000:.3f} ms bare; {looks[-1]:.2f} looks per "
                f"read of {CONCURRENT} at once"
            )

    def p50(runs: list[tuple[list[float], list[float]]], side: int) -> float:
        return median([percentile(r[side], 50) * 1000 for r in runs])

    name = "read barrier (key read)"
    note = (
        f"{samples} reads x {repeat} repetitions each way, alternating with a bare "
        "`get_call` (medians of per-repetition p50s); a look is the broker's high watermark "
        f"and the committed positions at once; {median(looks):.2f} looks per read when "
        f"{CONCURRENT} read at once"
    )
    return [
        Row(name, "caught up, p50", p50(caught, 0), "ms", p50(caught, 1), "bare read", "", note),
        Row(name, "right after a leader's answer, p50", p50(after, 0), "ms", p50(after, 1),
            "bare read"),
        Row("read barrier (a run's calls)", "caught up, p50", p50(lists, 0), "ms", p50(lists, 1),
            "bare query"),
    ]  # fmt: skip
