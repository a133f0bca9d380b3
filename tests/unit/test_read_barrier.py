"""The read barrier's own rules, on a log and positions the test moves by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from toolledger.events.log import LogError, partition_for
from toolledger.port import runs_of_key
from toolledger.projections.barrier import ReadBarrier, StaleRead


class Log:
    """End offsets the test sets; `gate` holds every look until set."""

    def __init__(self, partitions: int = 4) -> None:
        self.ends = dict.fromkeys(range(partitions), 1)
        self.asked: list[frozenset[int]] = []
        self.looking = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def partition_count(self) -> int:
        return len(self.ends)

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]:
        wanted = frozenset(self.ends if partitions is None else partitions)
        self.asked.append(wanted)
        self.looking.set()
        seen = dict(self.ends)  # what the broker says is what it held when asked
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return {p: seen[p] for p in wanted}


class Positions:
    def __init__(self) -> None:
        self.at: dict[int, int] = {}
        self.halted: dict[int, str] = {}
        self.reads = 0

    async def committed(self, partitions: Collection[int]) -> dict[int, int]:
        self.reads += 1
        return {p: self.at[p] for p in partitions if p in self.at}

    async def halts(self, partitions: Collection[int]) -> dict[int, str]:
        return {p: self.halted[p] for p in partitions if p in self.halted}


def barrier(log: Log, positions: Positions, timeout: float = 5.0) -> ReadBarrier:
    return ReadBarrier(log, positions, timeout=timeout, poll=0.01)


def test_a_key_covers_every_run_its_id_may_belong_to() -> None:
    """A run_id may hold a ':', so `a:b:c` may be run `a` or run `a:b`; a history read may be
    of a run id itself."""
    assert runs_of_key("r1:c1") == ["r1"]
    assert runs_of_key("a:b:c") == ["a", "a:b"]
    assert runs_of_key("r1:c1:compensate", may_be_run=True) == ["r1", "r1:c1", "r1:c1:compensate"]
    assert runs_of_key("r1", may_be_run=True) == ["r1"]


async def test_a_caught_up_read_costs_one_look_and_covers_only_its_runs_partition() -> None:
    log, positions = Log(), Positions()
    positions.at = dict.fromkeys(range(4), 1)
    gate = barrier(log, positions)
    await gate.wait(["r1"])
    assert log.asked == [frozenset({partition_for("r1", 4)})]
    assert (gate.looks, gate.waited) == (1, 0)


async def test_concurrent_readers_share_looks_and_none_takes_a_look_asked_before_it() -> None:
    """Sixty-four readers at once cost two looks, not sixty-four; and a reader who asked while
    a look was in flight is answered by the next one, whose end covers a write acknowledged
    before it asked (the look in flight may have been answered before that write)."""
    log, positions = Log(), Positions()
    positions.at = dict.fromkeys(range(4), 1)
    gate = barrier(log, positions, timeout=0.5)
    log.gate.clear()
    first = asyncio.create_task(gate.wait(["r1"]))
    await log.looking.wait()
    log.ends[partition_for("r2", 4)] = 9  # acknowledged after the first look left
    later = [asyncio.create_task(gate.wait([f"r{i}"])) for i in range(2, 66)]
    await asyncio.sleep(0)
    log.gate.set()
    await first
    with pytest.raises(StaleRead, match="is committed to offset 1, the log ends at 9"):
        await asyncio.gather(*later)
    assert gate.looks == 2
    assert len(log.asked) == 2 and log.asked[1] >= {partition_for(f"r{i}", 4) for i in (2, 3)}


async def test_a_read_waits_for_the_projection_and_a_hint_ends_the_wait() -> None:
    log, positions = Log(), Positions()
    positions.at = dict.fromkeys(range(4), 1)
    p = partition_for("r1", 4)
    log.ends[p] = 5
    gate = ReadBarrier(log, positions, timeout=5.0, poll=60.0)  # only a hint can end it
    reading = asyncio.create_task(gate.wait(["r1"]))
    await asyncio.sleep(0.01)
    assert not reading.done()
    positions.at[p] = 4
    gate.hint()
    await asyncio.sleep(0.01)
    assert not reading.done(), "committed to 4 is not the end, 5"
    positions.at[p] = 5
    gate.hint()
    await asyncio.wait_for(reading, 1)
    assert gate.waited == 1


async def test_past_the_bound_the_read_is_stale_naming_each_partition_behind() -> None:
    log, positions = Log(), Positions()
    positions.at = {0: 3, 1: 1, 2: 7, 3: 1}
    log.ends = {0: 5, 1: 1, 2: 8, 3: 1}
    gate = barrier(log, positions, timeout=0.05)
    with pytest.raises(StaleRead) as stale:
        await gate.wait()
    said = str(stale.value)
    assert "partition 0 is committed to offset 3, the log ends at 5 (2 records behind)" in said
    assert "partition 2 is committed to offset 7, the log ends at 8 (1 record behind)" in said
    assert "partition 1" not in said and "TOOLLEDGER_READ_BARRIER_TIMEOUT_S" in said
    assert stale.value.code == "stale_read"


async def test_a_read_waiting_for_a_halted_partition_is_stale_at_once_saying_why() -> None:
    """A halted partition is committed no further until someone deploys: a reader waiting for
    it used to wait out the whole bound, which held a console page past its client's time-out
    while the banner said why. It must fail soon after its first look, naming the halt."""
    log, positions = Log(), Positions()
    positions.at = dict.fromkeys(range(4), 1)
    p = partition_for("r1", 4)
    log.ends[p] = 5
    positions.halted[p] = "halted at offset 1: unknown key id ops-x"
    gate = barrier(log, positions, timeout=30.0)
    began = asyncio.get_running_loop().time()
    with pytest.raises(StaleRead, match=f"partition {p} is halted: halted at offset 1"):
        await gate.wait(["r1"])
    assert asyncio.get_running_loop().time() - began < 10.0, "waited out the bound"


async def test_a_log_that_cannot_say_where_it_ends_is_a_stale_read_not_an_old_one() -> None:
    log, positions = Log(), Positions()
    log.fail = LogError("the broker does not answer")
    with pytest.raises(StaleRead, match="cannot learn where the log ends"):
        await barrier(log, positions).wait(["r1"])


async def test_a_partition_never_projected_counts_as_committed_to_its_epoch_marker() -> None:
    """Offset 0 is the epoch marker, never folded: an empty ledger over an empty log is fresh,
    and one over a log with a record is not."""
    log, positions = Log(), Positions()
    await barrier(log, positions).wait()
    log.ends[partition_for("r1", 4)] = 2
    with pytest.raises(StaleRead):
        await barrier(log, positions, timeout=0.05).wait(["r1"])
