"""The leaders a process reads from: their directory, and the read index for its barrier.

Every process that reads the ledger of a stack with `TOOLLEDGER_LEADER=auto` (the default) asks
the partitions' leaders, if any are registered, where their memory ends, and a key's record from
that memory (`toolledger.leader.runtime_side.index`); a runtime also sends its calls to them
(`toolledger.wiring.leader`). This module builds what both need from settings, and imports no
stack, so that `LedgerStack.connect` can ask it.
"""

from __future__ import annotations

from toolledger.errors import LedgerUnavailable
from toolledger.leader.projector_side.reads import LeaderReads
from toolledger.leader.runtime_side.connection import LeaderDirectory
from toolledger.leader.runtime_side.index import LeaderIndex
from toolledger.leader.runtime_side.tls import ClientTLS
from toolledger.projections.dberrors import database_errors
from toolledger.settings import Settings


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


def leader_directory(settings: Settings) -> LeaderDirectory | None:
    """Where the leaders of `settings`' ledger are; None with `TOOLLEDGER_LEADER=off`."""
    if settings.leader == "off" or settings.database_url is None:
        return None
    tls = None
    if settings.runtime_tls_leader_ca is not None:
        tls = ClientTLS.load(
            settings.runtime_tls_leader_ca,
            settings.runtime_tls_cert,
            settings.runtime_tls_key,
            settings.runtime_tls_leader_name,
        )
    reads = RegisteredLeaders(LeaderReads(settings.database_url, settings.schema_name))
    return LeaderDirectory(reads, tls=tls)


def leader_index(directory: LeaderDirectory, settings: Settings) -> LeaderIndex:
    """The read index of `directory`'s leaders, each asked within the leader timeout."""
    return LeaderIndex(directory, settings.partitions, settings.leader_timeout_ms / 1000)
