"""The runtime's promises on the leader fast path: the same scenarios as the direct path.

`TestLeaderRuntime` runs every scenario of `tests/contract/test_runtime_scenarios.py` with the
harness's own runtime on a `LeaderPort` (`toolledger.leader`): its reservations, outcomes and
abandons are answered by the in-process projector's leader from memory, proven by Kafka's
offsets. The second runtimes of the scenarios stay on the direct path (a `Ledger.from_stack`) or
are worker processes that find the leader themselves (`Ledger.connect`), so every race there is
a leader against a foreign writer. A scenario that passes on the direct path and fails here is
a verdict the fast path answered differently from the log's fold.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.contract import test_runtime_scenarios as scenarios
from tests.contract.runtime_harness import SIGNING_KEY, Clock, Harness
from tests.fake_billing import FakeBilling, use_service
from tests.isolated import Isolated, running_stack
from toolledger import Ledger, ProjectorSettings
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.wiring.leader import leader_port
from toolledger.wiring.stack_port import StackPort


async def leaders_registered(port: LeaderPort, partitions: int, timeout: float = 10) -> None:
    """Bounded polling until every partition has a leader registered (the projector takes
    partitions on its first ownership round, just after the stack starts)."""
    give_up = time.monotonic() + timeout
    while len([a for a in (await port.directory.leaders()).values() if a]) < partitions:
        assert time.monotonic() < give_up, "no leader registered for every partition"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def leader_harness(tmp: Path, isolated: Isolated, **settings: Any) -> AsyncIterator[Harness]:
    """`kafka_postgres_harness`, with the harness's runtime on the leader fast path."""
    clock = Clock()
    service = use_service(FakeBilling(tmp / "billing.db"))
    on = isolated.settings(
        ProjectorSettings,
        verify_keys=SIGNING_KEY.verify_keys(),
        verdict_timeout_s=5,
        **{"leader": "auto", **settings},
    )
    async with running_stack(on) as stack:
        port = leader_port(StackPort(stack), on)
        assert isinstance(port, LeaderPort)
        await leaders_registered(port, on.partitions)
        ledger = Ledger(port, verdict_timeout=5, clock=clock)
        try:
            yield Harness(ledger, stack, service, clock, tmp, on)
            # Every runtime request of the harness's own runtime was the leader's to answer.
            assert port.stats["direct"] == 0, port.stats
        finally:
            await ledger.close()


class TestLeaderRuntime(scenarios.TestKafkaPostgresRuntime):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
        async with leader_harness(tmp_path, isolated) as h:
            yield h
