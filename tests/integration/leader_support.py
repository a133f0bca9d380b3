"""What the leader's integration tests share: settings, a runtime's port, waits and counts.

A test on the leader fast path builds projector settings with runtimes on it
(`TOOLLEDGER_LEADER=auto`), opens a runtime's `LeaderPort` on a stack, waits until every
partition has a leader registered, makes calls over several runs and counts what PostgreSQL
holds of them. The tests that freeze an owner wait until a process holds every partition lock
and freeze it between batches. `tests/integration/test_leader.py`, `test_leader_tls.py`,
`test_leader_zombie.py` and `test_owner_lease.py` use these.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from tests import builders as b
from tests.integration.procs import Proc, until
from tests.isolated import Isolated
from tests.verdict_hold import VerdictHold
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.leader.projector_side.listener import LeaderServer
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.projections.migrations import quote_ident
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import compare, replay
from toolledger.projections.store import LedgerStore
from toolledger.settings import ProjectorSettings, Settings
from toolledger.wiring.leader import leader_port
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort


def leader_settings(isolated: Isolated, **fields: Any) -> ProjectorSettings:
    """The test's settings, runtimes on the fast path (`TOOLLEDGER_LEADER=auto`)."""
    return isolated.settings(ProjectorSettings, verify_keys=b.KEYS, **{"leader": "auto", **fields})


@asynccontextmanager
async def runtime_port(stack: LedgerStack, settings: Settings) -> AsyncIterator[LeaderPort]:
    """A runtime's `LeaderPort` on `stack`, with the runtime's side of `settings`."""
    port = leader_port(StackPort(stack), settings)
    assert isinstance(port, LeaderPort)
    try:
        yield port
    finally:
        await port.close()


async def all_led(port: LeaderPort, partitions: int) -> dict[int, str | None]:
    """Every partition's registered leader, once each has one."""

    async def led() -> dict[int, str | None] | None:
        found = await port.directory.leaders()
        return found if len([a for a in found.values() if a]) == partitions else None

    return await until(led, timeout=15, what="a leader registered for every partition")


def hold_commits(store: LedgerStore) -> asyncio.Event:
    """Hold every batch `store` would write (folded there or by a leader) until the event
    returned is set: the state "answered, projection not committed"."""
    hold = VerdictHold(store)
    hold.hold()
    return hold.released


def leader_of(stack: LedgerStack) -> LeaderServer:
    assert stack.projector is not None and isinstance(stack.projector.follower, LeaderServer)
    return stack.projector.follower


def calls(n: int, tag: str = "run") -> list[Event]:
    """A reservation of `n` calls over several runs, each followed by its outcome."""
    events: list[Event] = []
    for i in range(n):
        reserved = b.reserved(f"{tag}-{i % 3}", f"c{i}", t=i)
        events += [reserved, b.completed(reserved, t=i + 0.5)]
    return events


async def history_count(isolated: Isolated, event_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """How many history rows each of `event_ids` has (absent: none)."""
    conn = await asyncpg.connect(isolated.database_url)
    try:
        rows = await conn.fetch(
            f"SELECT event_id, count(*) AS n FROM {quote_ident(isolated.schema)}."  # noqa: S608
            "tool_execution_history WHERE event_id = ANY($1::uuid[]) GROUP BY event_id",
            event_ids,
        )
    finally:
        await conn.close()
    return {uuid.UUID(bytes=r["event_id"].bytes): int(r["n"]) for r in rows}


async def owns_every_partition(
    db: LedgerDB, proc: Proc, partitions: int, *, timeout: float = 30.0
) -> None:
    """Wait until `proc`'s lock session holds every partition's lock."""

    async def check() -> bool:
        owners = await db.lock_owners()
        return len(owners) == partitions and set(owners.values()) == {proc.pid}

    await until(check, timeout=timeout, what=f"{proc.name} to hold every partition lock")


async def freeze_between_batches(db: LedgerDB, proc: Proc) -> None:
    """SIGSTOP `proc` at a moment none of its sessions is inside a transaction (a frozen batch
    transaction would hold the offset row its successor must write); retried until caught so."""
    sessions = (
        "SELECT state, wait_event, xact_start IS NOT NULL AS open FROM pg_stat_activity "
        "WHERE application_name LIKE $1"
    )

    async def settled() -> list[Any] | None:
        rows = await db.fetch(sessions, f"toolledger-%-{proc.pid}")
        busy = [r for r in rows if r["state"] == "active" and r["wait_event"] != "ClientRead"]
        return None if busy or not rows else rows

    for _ in range(100):
        proc.freeze()
        rows = await until(settled, timeout=5, what=f"the sessions of frozen {proc.name}")
        if not any(r["open"] for r in rows):
            return
        proc.resume()
        await asyncio.sleep(0.017)
    raise AssertionError(f"could not freeze {proc.name} between batches")


async def refold_matches(
    stack: LedgerStack, db: LedgerDB, isolated: Isolated, replicas: list[str]
) -> dict[uuid.UUID, Verdict]:
    """Re-fold the log into a fresh schema up to the live offsets: the live ledger must be the
    same (rows, history, digest). Returns the re-fold's verdict of every event_id."""
    rows = await db.fetch("SELECT partition, next_offset FROM projection_offsets")
    targets = {int(r["partition"]): int(r["next_offset"]) for r in rows}
    replicas.append(f"{isolated.schema}_refold")
    fresh = PostgresLedger(isolated.database_url, replicas[-1], verify_keys=b.KEYS)
    await fresh.start()
    try:
        report = await replay(stack.events, fresh, targets=targets)
        replayed = await fresh.snapshot()
        verdicts = await fresh.verdicts([entry.event_id for entry in replayed.history])
    finally:
        await fresh.close()
    live = await stack.store.snapshot()
    assert compare(live, replayed) == []
    assert report.replay_digest == live.digest()
    return verdicts
