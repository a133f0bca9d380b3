"""Where a runtime's fast path is switched on: a `LeaderPort` per runtime.

The rest of the wiring calls `leader_port` here and `start_leader`
(`toolledger.wiring.projector_leader`, the leader beside each projector) and nothing else of
`toolledger.leader`, so no other part of the codebase knows leaders exist.

`leader_port` gives a runtime on Kafka and PostgreSQL its port: a `StackLeaderPort` over the
direct path with `TOOLLEDGER_LEADER=auto` (the default), else the direct path. With no leader
registered a `LeaderPort` behaves as the direct path; the embedded (memory) stack keeps the
direct path, having no network to save.

The runtime side of the leader knows nothing of stacks: `StackLeaderPort` is the `LeaderPort`
the wiring builds, which gives it what it needs of the stack under its direct path
(`DirectServices`, looked up on the stack at every use, as `StackPort` does) and where the
leaders are (a `LeaderDirectory`, `toolledger.wiring.leader_index`), and keeps that stack as
`stack` for whoever closes it, as every port the wiring builds does.
"""

from __future__ import annotations

import uuid

from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.leader.runtime_side.connection import LeaderDirectory
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.settings import Settings
from toolledger.wiring.leader_index import leader_directory
from toolledger.wiring.stack import LedgerStack
from toolledger.wiring.stack_port import StackPort


class StackServices:
    """`DirectServices` over a stack: its commands, waiter and log, looked up at every use."""

    def __init__(self, stack: LedgerStack) -> None:
        self.stack = stack

    @property
    def max_record_bytes(self) -> int:
        return self.stack.events.max_record_bytes

    async def offload(self, event: Event) -> Event:
        return await self.stack.commands.offload(event)

    async def restored_verdict(self, verdict: Verdict) -> Verdict:
        return await self.stack.commands.restored_verdict(verdict)

    async def committed(self, event_id: uuid.UUID, timeout: float) -> None:
        await self.stack.waiter.wait(event_id, timeout)


class StackLeaderPort(LeaderPort):
    """The `LeaderPort` over a `StackPort`, keeping its stack (see the module)."""

    def __init__(
        self, direct: StackPort, directory: LeaderDirectory, partitions: int, bound: float
    ) -> None:
        super().__init__(direct, StackServices(direct.stack), directory, partitions, bound)
        self.stack = direct.stack


def leader_port(direct: StackPort, settings: Settings) -> StackPort | StackLeaderPort:
    """The port a runtime uses over `direct`: the fast path unless it is off or not possible.
    Its connections to the leaders are its own, made with `settings`' TLS; the stack's read
    barrier keeps others (`stack.leaders`), made with the stack's."""
    directory = leader_directory(settings)
    if directory is None:
        return direct
    port = StackLeaderPort(
        direct, directory, settings.partitions, settings.leader_timeout_ms / 1000
    )
    direct.stack.on_close.insert(0, port.close)  # settles (reads its waiter) before the rest
    return port
