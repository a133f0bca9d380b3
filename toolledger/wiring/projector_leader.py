"""Where a projector's leader is started: the `LeaderServer` beside each projector.

`start_leader` gives a projector process its `LeaderServer` (the projector's
`PartitionFollower`) unless `TOOLLEDGER_LEADER_LISTEN=off`, with TLS when the projector's
settings name its certificate (`toolledger.leader.projector_side.tls`). The stack calls it when
it runs a projector, at call time; it imports nothing of the stack, so the two make no circle.

A leader that listens beyond loopback without verifying runtimes' certificates starts, with a
warning in the log: on a private network (a compose network, a VPC whose other hosts are the
ledger's own) that is as exposed as the broker runtimes append to directly, and refusing would
only push such a deployment back to the direct path. Anywhere else it lets whoever can reach
the port append what a runtime may append, for any run, hence the warning's words.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from toolledger.events.log import EventLog
from toolledger.events.signing import VerifyKeys
from toolledger.leader.projector_side.listener import LeaderServer
from toolledger.leader.projector_side.reads import LeaderReads
from toolledger.leader.projector_side.tls import is_loopback, server_context
from toolledger.settings import ProjectorSettings, Settings, load_settings

log = logging.getLogger("toolledger.leader")


async def start_leader(
    settings: Settings, events: EventLog, keys: VerifyKeys, owns: Callable[[int], bool]
) -> LeaderServer | None:
    """The leader of a projector process, listening; None with `TOOLLEDGER_LEADER_LISTEN=off`.
    It answers for a partition only while `owns` says so (`PartitionLocks.holds`: the lease)."""
    if settings.leader_listen == "off":
        return None
    if not isinstance(settings, ProjectorSettings):  # its TLS settings are the projector's own
        settings = load_settings(ProjectorSettings, **settings.model_dump())
    database_url, _ = settings.require_services()
    host, _, port = settings.leader_listen.rpartition(":")
    tls = None
    if settings.leader_tls_cert is not None and settings.leader_tls_key is not None:
        tls = server_context(
            settings.leader_tls_cert, settings.leader_tls_key, settings.leader_tls_runtime_ca
        )
    reads = LeaderReads(database_url, settings.schema_name)
    server = LeaderServer(
        events,
        reads,
        keys,
        settings.partitions,
        host=host,
        port=int(port),
        max_body=settings.max_record_bytes + 64 * 1024,
        tls=tls,
        advertise=settings.leader_advertise,
        owns=owns,
    )
    await server.start()
    warning = exposure_warning(
        server.bound,
        tls=tls is not None,
        verifies_runtimes=settings.leader_tls_runtime_ca is not None,
    )
    if warning is not None:
        log.warning("%s", warning)
    return server


def exposure_warning(address: str, *, tls: bool, verifies_runtimes: bool) -> str | None:
    """What to warn of for a leader bound to `address` (see the module), or None."""
    if is_loopback(address.rpartition(":")[0]) or verifies_runtimes:
        return None
    how = "over TLS but accepting any client" if tls else "without TLS"
    return (
        f"the leader listens on {address}, beyond this machine, {how}: anyone who can reach it "
        "can append reservations and outcomes for any run. Unless this network is private, set "
        "TOOLLEDGER_LEADER_TLS_CERT, TOOLLEDGER_LEADER_TLS_KEY and "
        "TOOLLEDGER_LEADER_TLS_RUNTIME_CA, or TOOLLEDGER_LEADER_LISTEN to a loopback address"
    )
