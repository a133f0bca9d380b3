"""The faust app every toolledger processor runs in, with the settings the brokers need.

Processors consume the facts topic (`toolledger.ledger`), never requests, and keep their state in
changelog-backed faust tables, so a restarted or moved processor recovers its state from Kafka.
The settings below are the ones that matter for that, against any Kafka and against the local
development broker (tansu, see docs/architecture.md, "Services"):

- `producer_max_batch_size=1` (bytes, so every record is its own batch). tansu answers
  ListOffsets "latest" with the base offset of the partition's last *batch* plus one, not its
  last record plus one (three records sent as one batch at offsets 2-4 report an end offset of
  3). faust's table recovery reads a changelog partition up to that end offset, so with batched
  changelog writes a recovered table would silently miss its newest entries. One record per batch
  keeps the end offsets exact. Production Kafka does not need it; its cost is a request per table
  write, which the small tables of processors do not notice.
- `broker_session_timeout` of 6 s (`DEFAULT_SESSION_TIMEOUT_S`): a SIGKILLed member holds its
  partitions until its session expires, so the faust default (60 s) would stall a restart for a
  minute; 6 s is the least a default Apache Kafka accepts (`group.min.session.timeout.ms`; it
  refuses a shorter one's join). tansu makes every group join wait about half of it. The
  heartbeat is a sixth of it.
- `table_standby_replicas=0`: the memory store keeps standby partitions in the same dict as
  active ones, and processors' tables are small enough to recover from their changelog quickly.
- `topic_partitions` = the facts topic's partition count, so changelogs are co-partitioned with
  it (faust writes a table change to the partition of the event being processed).
- No leader topic, no web server: processors need neither, and tests run many apps side by side.
- `consumer_auto_offset_reset="earliest"`: a new group folds the facts from the beginning.

faust's consumer waits up to 1.5 s per fetch (hard-coded in faust's aiokafka driver) and tansu
does not wake a parked fetch when data arrives, so against tansu a fact can take up to 1.5 s to
reach a processor. That delays reconciliation; it never changes what is decided.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from toolledger.extras import MissingExtra
from toolledger.processors import DEFAULT_SESSION_TIMEOUT_S
from toolledger.settings import Settings

if TYPE_CHECKING:
    import faust

__all__ = ["DEFAULT_SESSION_TIMEOUT_S", "processor_app"]


def processor_app(
    settings: Settings,
    name: str,
    *,
    partitions: int,
    group: str | None = None,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT_S,
    replication_factor: int | None = None,
    commit_interval: float = 1.0,
) -> faust.App:
    """A faust app for the processor `name`, its consumer group and table namespace.

    `group` defaults to `<topic_prefix>toolledger.<name>`; processes with the same group share
    the facts partitions between them. `replication_factor` applies to the changelog topics
    faust creates (default: `TOOLLEDGER_REPLICATION_FACTOR`, 3 in production).
    """
    try:
        import faust
    except ImportError as exc:
        raise MissingExtra("server", "faust", f"the {name} (a faust processor)") from exc
    _, bootstrap = settings.require_services()
    app_id = group or f"{settings.topic_prefix}toolledger.{name}"
    options: dict[str, Any] = {
        "broker": [f"kafka://{server.strip()}" for server in bootstrap.split(",")],
        "store": "memory://",
        "producer_max_batch_size": 1,
        "producer_acks": -1,
        "broker_session_timeout": session_timeout,
        "broker_heartbeat_interval": session_timeout / 6,
        "broker_request_timeout": max(30.0, session_timeout * 2),
        "broker_commit_interval": commit_interval,
        "table_standby_replicas": 0,
        "topic_partitions": partitions,
        "topic_replication_factor": replication_factor or settings.replication_factor,
        "topic_disable_leader": True,
        "consumer_auto_offset_reset": "earliest",
        "web_enabled": False,
    }
    return faust.App(app_id, **options)


def facts_topic(app: faust.App, settings: Settings, partitions: int) -> faust.TopicT:
    """The facts topic as every processor reads it: raw bytes keyed by run_id (the projector's
    JSON facts are parsed by the agent, so a bad record is skipped, not a crashed stream)."""
    return app.topic(
        settings.facts_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
    )
