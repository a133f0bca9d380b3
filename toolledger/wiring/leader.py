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
leaders are (`LeaderAddresses`: the projector side's `LeaderReads`, a database error turned
into `LedgerUnavailable`), and keeps that stack as `stack` for whoever closes it, as every port
the wiring builds does.
"""

from __future__ import annotations

import uuid

from toolledger.errors import LedgerUnavailable
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.leader.projector_side.reads import LeaderReads
from toolledger.leader.runtime_side.connection import LeaderDirectory
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.leader.runtime_side.tls import ClientTLS
from toolledger.projections.dberrors import database_errors
from toolledger.settings import Settings
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


class RegisteredLeaders:
    """`LeaderAddresses` over `LeaderReads`: a database error is `LedgerUnavailable`."""

    def __init__(self, reads: LeaderReads) -> None:
        self.reads = reads

    async def leaders(self) -> dict[int, str | None]:
        try:
            return await self.reads.leaders()
        except database_errors() as exc:
            raise LedgerUnavailable(str(exc)) from exc

    async def close(self) -> None:
        await self.reads.close()


class StackLeaderPort(LeaderPort):
    """The `LeaderPort` over a `StackPort`, keeping its stack (see the module)."""

    def __init__(
        self, direct: StackPort, directory: LeaderDirectory, partitions: int, bound: float
    ) -> None:
        super().__init__(direct, StackServices(direct.stack), directory, partitions, bound)
        self.stack = direct.stack


def leader_port(direct: StackPort, settings: Settings) -> StackPort | StackLeaderPort:
    """The port a runtime uses over `direct`: the fast path unless it is off or not possible."""
    stack = direct.stack
    if settings.leader == "off" or settings.database_url is None:
        return direct
    tls = None
    if settings.runtime_tls_leader_ca is not None:
        tls = ClientTLS.load(
            settings.runtime_tls_leader_ca,
            settings.runtime_tls_cert,
            settings.runtime_tls_key,
            settings.runtime_tls_leader_name,
        )
    reads = RegisteredLeaders(LeaderReads(settings.database_url, settings.schema_name))
    port = StackLeaderPort(
        direct,
        LeaderDirectory(reads, tls=tls),
        settings.partitions,
        settings.leader_timeout_ms / 1000,
    )
    stack.on_close.insert(0, port.close)  # settles (reads its waiter) before the rest closes
    return port
