"""What the leader's integration tests share: settings, a runtime's port, waits and counts.

A test on the leader fast path builds projector settings with runtimes on it
(`TOOLLEDGER_LEADER=auto`), opens a runtime's `LeaderPort` on a stack, waits until every
partition has a leader registered, makes calls over several runs and counts what PostgreSQL
holds of them. `tests/integration/test_leader.py`, `test_leader_tls.py` and
`test_leader_zombie.py` use these.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from tests import builders as b
from tests.integration.procs import until
from tests.isolated import Isolated
from toolledger.events.models import Event
from toolledger.leader.projector_side.listener import LeaderServer
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.projections.migrations import quote_ident
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
    released = asyncio.Event()
    for name in ("apply_written", "apply_folded"):
        write = getattr(store, name)

        async def held(*args: Any, _write: Any = write, **kwargs: Any) -> Any:
            await released.wait()
            return await _write(*args, **kwargs)

        setattr(store, name, held)
    return released


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
