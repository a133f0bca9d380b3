"""Replay split across worker processes, against real Kafka and PostgreSQL.

A split replay folds disjoint sets of partitions in several processes and merges their
serialised rows into one digest. These cases guard what that can get wrong: a digest that
differs from the one-process replay's (an order or a row lost in the merge, a share counted
twice), a ledger that differs from it, and partitions lost or doubled by the split.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from tests import builders as b
from toolledger.events.codec import encode
from toolledger.events.kafka import KafkaLog
from toolledger.events.models import Event
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import replay
from toolledger.projections.replay_processes import replay_in_processes, split

PARTITIONS = 4


def _events() -> list[Event]:
    """Runs of every partition, with calls completed, unknown, rejected and checkpointed."""
    events: list[Event] = []
    for n in range(40):
        run_id = f"run-{n % 11}"
        r = b.reserved(run_id, f"c{n}", t=n)
        events += [r, b.completed(r, t=n + 1) if n % 3 else b.indeterminate(r, t=n + 1)]
        if n % 5 == 0:
            events.append(b.reserved(run_id, f"c{n}", t=n + 2))  # rejected: the key is held
    events += [b.run_started("fenced"), b.checkpointed("fenced", 0, ("c1",), t=1)]
    return events


@pytest.fixture
async def log(
    kafka_bootstrap: str, topic_prefix: str
) -> AsyncIterator[tuple[KafkaLog, dict[int, int]]]:
    """The events topic with the events above and one undecodable record, and each
    partition's end (the replay targets)."""
    events = KafkaLog(kafka_bootstrap, f"{topic_prefix}.events")
    await events.start()
    try:
        await events.ensure_topic(PARTITIONS)
        targets = dict.fromkeys(range(PARTITIONS), 1)
        for event in _events():
            at = await events.append(event.run_id, encode(event))
            targets[at.partition] = at.offset + 1
        at = await events.append("poisoned", b"\x00 not an event")
        targets[at.partition] = at.offset + 1
        yield events, targets
    finally:
        await events.close()


async def _store(pg_dsn: str, replicas: list[str]) -> PostgresLedger:
    replicas.append(f"t_{uuid.uuid4().hex[:12]}")
    store = PostgresLedger(pg_dsn, replicas[-1], verify_keys=b.KEYS)
    await store.start()
    return store


@pytest.mark.parametrize("processes", [2, 3, 8])
async def test_a_split_replay_gives_the_one_process_replays_ledger_and_digest(
    log: tuple[KafkaLog, dict[int, int]],
    pg_dsn: str,
    kafka_bootstrap: str,
    replicas: list[str],
    processes: int,
) -> None:
    """Whatever the number of workers (fewer than the partitions, unevenly, or more), the
    digest printed must be the one-process replay's, and so must the ledger it describes."""
    events, targets = log
    alone, split_into = await _store(pg_dsn, replicas), await _store(pg_dsn, replicas)
    try:
        expected = await replay(events, alone, targets=targets)
        told: list[int] = []
        got = await replay_in_processes(
            events,
            split_into,
            targets=targets,
            processes=processes,
            database_url=pg_dsn,
            bootstrap=kafka_bootstrap,
            progress=lambda done, _total: told.append(done),
        )
        assert (got.events, got.dead_letters) == (expected.events, expected.dead_letters)
        assert expected.dead_letters == 1
        assert got.replay_digest == expected.replay_digest
        assert await split_into.digest() == expected.replay_digest
        assert await split_into.snapshot() == await alone.snapshot()
        assert sum(told) <= sum(t - 1 for t in targets.values())
    finally:
        await alone.close()
        await split_into.close()


async def test_a_split_replay_digest_changes_with_any_stored_row(
    log: tuple[KafkaLog, dict[int, int]], pg_dsn: str, kafka_bootstrap: str, replicas: list[str]
) -> None:
    """The merged digest must cover every share: a split replay of a log with one event more
    may not print the digest of the shorter log."""
    events, targets = log
    shorter = dict(targets)
    longest = max(shorter, key=lambda p: shorter[p])
    shorter[longest] -= 1
    full, short = await _store(pg_dsn, replicas), await _store(pg_dsn, replicas)
    try:
        common = {"processes": 2, "database_url": pg_dsn, "bootstrap": kafka_bootstrap}
        a = await replay_in_processes(events, full, targets=targets, **common)  # type: ignore[arg-type]
        c = await replay_in_processes(events, short, targets=shorter, **common)  # type: ignore[arg-type]
        assert a.replay_digest != c.replay_digest
        assert c.replay_digest == await short.digest()
    finally:
        await full.close()
        await short.close()


def test_the_split_gives_every_partition_with_events_to_exactly_one_worker() -> None:
    """A partition given twice would be folded twice (the second fold's CAS fails), one given
    to nobody would be missing from the replay; the groups should weigh about the same."""
    targets = {0: 101, 1: 1, 2: 51, 3: 60, 4: 40, 5: 11}
    for processes in (1, 2, 3, 6, 10):
        groups = split(targets, processes)
        given = [p for g in groups for p in g]
        assert sorted(given) == [0, 2, 3, 4, 5]
        assert all(g[p] == targets[p] for g in groups for p in g)
        assert len(groups) <= processes
    two = split(targets, 2)
    weights = sorted(sum(t - 1 for t in g.values()) for g in two)
    assert weights == [119, 139]
    assert split({0: 1}, 2) == [{}]
