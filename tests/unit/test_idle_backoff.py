"""The idle back-off rule (`toolledger.events.pacing`) and the append hints' rate limit
(`toolledger.projections.hints`), on their own: no broker, no database, a clock passed in."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from toolledger.events.log import Position
from toolledger.events.pacing import IdleBackoff
from toolledger.projections.hints import AppendHints, parse_hint


def test_a_reader_with_records_flowing_never_waits() -> None:
    """A reader that keeps finding records must fetch again at once: a wait there would add
    to every verdict's latency."""
    backoff = IdleBackoff(bound=0.5, idle_after=0.25, first=0.01)
    backoff.active(0.0)
    for now in (0.05, 0.1, 0.2, 0.24):
        backoff.found_nothing(now)
        assert backoff.delay == 0
    backoff.active(0.24)
    backoff.found_nothing(0.45)
    assert backoff.delay == 0, "the quiet time counts from the last records"


def test_an_idle_reader_backs_off_doubling_up_to_the_bound() -> None:
    """Once nothing came for `idle_after`, each empty fetch doubles the wait, never past the
    bound: the bound is the promise made to a record nobody hinted."""
    backoff = IdleBackoff(bound=0.5, idle_after=0.25, first=0.01)
    backoff.active(0.0)
    delays = []
    for i in range(12):
        backoff.found_nothing(0.3 + i)
        delays.append(backoff.delay)
    assert delays[:7] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5]
    assert set(delays[6:]) == {0.5}


def test_records_or_a_hint_end_the_back_off_at_once() -> None:
    """A backed-off reader that is told records are there must fetch at once and keep
    fetching at once for `idle_after`, not resume its long waits after one fetch."""
    backoff = IdleBackoff(bound=0.5, idle_after=0.25, first=0.5)
    backoff.active(0.0)
    backoff.found_nothing(1.0)
    assert backoff.delay == 0.5
    backoff.active(2.0)
    assert backoff.delay == 0
    backoff.found_nothing(2.1)
    assert backoff.delay == 0


def test_a_bound_of_zero_never_backs_off() -> None:
    """`TOOLLEDGER_IDLE_FETCH_BOUND_MS=0` keeps the old behaviour: every fetch at once."""
    backoff = IdleBackoff(bound=0)
    backoff.active(0.0)
    for now in range(1, 10):
        backoff.found_nothing(float(now))
    assert backoff.delay == 0


async def test_hints_to_another_process_are_rate_limited_per_partition() -> None:
    """Under load a runtime must not send a notification per append: one per partition per
    quiet period. The first append is hinted at once; those made during the quiet period
    after it are hinted together when it ends, with the last one's end, or a projector
    fetching a carried partition only as far as its hints say would never read them."""
    sent: list[str] = []

    async def notify(payload: str) -> None:
        sent.append(payload)

    now = [100.0]
    hints = AppendHints(notify, quiet=0.1, clock=lambda: now[0])
    for offset in range(5):
        hints.appended(Position(3, offset))
        hints.appended(Position(1, offset))
        await asyncio.sleep(0)  # the hint is sent before the next append
        await asyncio.sleep(0)
        now[0] += 0.01
    assert sent == ["1:1,3:1"]
    now[0] += 0.1
    await asyncio.sleep(0.1)  # the quiet period ends: one hint for what came during it
    assert sent == ["1:1,3:1", "1:5,3:5"]
    now[0] += 0.2
    hints.appended(Position(3, 9))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sent[-1] == "3:10"
    await hints.close()


def test_a_hint_names_each_partition_with_its_end() -> None:
    """What a projector hears: ends where a writer sent them, none from an older writer's bare
    partition numbers, and every partition when the payload is not a hint at all."""
    assert parse_hint("1:5,3:10") == {1: 5, 3: 10}
    assert parse_hint("2,4") == {2: None, 4: None}
    assert parse_hint("garbage") is None


async def test_a_hint_that_could_not_be_sent_is_not_counted_as_sent() -> None:
    """A failed notification must not silence the next append's hint for a quiet period: the
    reader it was meant to wake may be backed off."""
    calls: list[str] = []

    async def notify(payload: str) -> None:
        calls.append(payload)
        if len(calls) == 1:
            raise asyncpg.ConnectionDoesNotExistError("down")

    hints = AppendHints(notify, quiet=10.0)
    hints.appended(Position(0, 1))
    await asyncio.sleep(0.05)
    hints.appended(Position(0, 2))
    await asyncio.sleep(0.05)
    assert calls == ["0:2", "0:3"]
    assert hints.sent == 1
    await hints.close()


@pytest.mark.parametrize("owned", [True, False])
async def test_a_partition_owned_here_is_woken_here(owned: bool) -> None:
    """The leader's appends are for partitions its own projector owns: they wake it directly
    and cost no notification; any other partition is hinted to its owner."""
    sent: list[str] = []
    woken: list[object] = []

    async def notify(payload: str) -> None:
        sent.append(payload)

    def wake(partitions: object) -> bool:
        woken.append(partitions)
        return owned

    hints = AppendHints(notify, wake)
    hints.appended(Position(2, 7))
    await asyncio.sleep(0.05)
    assert woken == [{2: 8}]
    assert sent == ([] if owned else ["2:8"])
    await hints.close()
