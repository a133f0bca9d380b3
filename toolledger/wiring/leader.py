"""Where the fast path is switched on: a leader beside each projector, a `LeaderPort` per runtime.

The rest of the wiring calls these two functions and nothing else of `toolledger.leader`, so
no other part of the codebase knows leaders exist:

- `start_leader` gives a projector process its `LeaderServer` (the projector's
  `PartitionFollower`) unless `TOOLLEDGER_LEADER_LISTEN=off`.
- `leader_port` gives a runtime on Kafka and PostgreSQL its port: a `LeaderPort` over the
  direct path with `TOOLLEDGER_LEADER=auto` (the default), else the direct path. With no
  leader registered a `LeaderPort` behaves as the direct path; the embedded (memory) stack
  keeps the direct path, having no network to save.
"""

from __future__ import annotations

from toolledger.events.log import EventLog
from toolledger.events.signing import VerifyKeys
from toolledger.leader.client import LeaderDirectory
from toolledger.leader.provenance import LeaderReads
from toolledger.leader.runtime_port import LeaderPort
from toolledger.leader.server import LeaderServer
from toolledger.settings import Settings
from toolledger.wiring.stack_port import StackPort


async def start_leader(
    settings: Settings, events: EventLog, keys: VerifyKeys
) -> LeaderServer | None:
    """The leader of a projector process, listening; None with `TOOLLEDGER_LEADER_LISTEN=off`."""
    if settings.leader_listen == "off":
        return None
    database_url, _ = settings.require_services()
    host, _, port = settings.leader_listen.rpartition(":")
    reads = LeaderReads(database_url, settings.schema_name)
    server = LeaderServer(
        events,
        reads,
        keys,
        settings.partitions,
        host=host,
        port=int(port),
        max_body=settings.max_record_bytes + 64 * 1024,
    )
    await server.start()
    return server


def leader_port(direct: StackPort, settings: Settings) -> StackPort | LeaderPort:
    """The port a runtime uses over `direct`: the fast path unless it is off or not possible."""
    stack = direct.stack
    if settings.leader == "off" or settings.database_url is None:
        return direct
    reads = LeaderReads(settings.database_url, settings.schema_name)
    port = LeaderPort(
        direct, LeaderDirectory(reads), settings.partitions, settings.leader_timeout_ms / 1000
    )
    stack.on_close.append(port.close)
    return port
