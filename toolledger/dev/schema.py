"""The checkout's dev ledger schema, reset when the log it was built from is gone.

A ledger schema is bound to one log: the projector stores the epoch marker it found at offset 0
of the events topic, and refuses to project any other log into it (`LogIdentityError`, exit
status 4: "project the new log into a new, empty ledger schema"). tansu keeps nothing across a
restart, so after `dev down` and `dev up` the checkout's schema was bound to a log that no
longer existed and `toolledger projector` could not start until someone dropped it by hand.

`dev up` now checks: when the schema holds a binding and the broker has no such log (the topic
is missing, or starts with another epoch, or has another partition count), the schema is dropped
and `dev up` says so. It is the dev stack's own schema (`checkout_namespace`), never a schema a
user named, and a ledger whose log is gone cannot be replayed or checked anyway. Apache Kafka
keeps its data across `dev down` and `dev up`, so there this happens only when its folder was
deleted.
"""

from __future__ import annotations

import uuid

from toolledger.devstack import Namespace, Services
from toolledger.events.log import LogError, LogIdentityError, TopicMissing

_BINDING = """
SELECT DISTINCT epoch, partitions FROM "{schema}".projection_offsets WHERE epoch IS NOT NULL
"""


async def reset_if_log_gone(services: Services, namespace: Namespace) -> str | None:
    """Drop the checkout's schema if the log it is bound to is gone; what was done, or None."""
    import asyncpg

    conn = await asyncpg.connect(services.database_url, timeout=10)
    try:
        table = f'"{namespace.schema}".projection_offsets'
        if await conn.fetchval("SELECT to_regclass($1)", table) is None:
            return None
        bound = await conn.fetch(_BINDING.format(schema=namespace.schema))
        if not bound:
            return None
        epochs = {uuid.UUID(str(row["epoch"])) for row in bound}
        partitions = {int(row["partitions"]) for row in bound}
        topic = f"{namespace.topic_prefix}toolledger.events"
        gone = await _log_gone(services.kafka_bootstrap, topic, epochs, partitions)
        if gone is None:
            return None
        await conn.execute(f'DROP SCHEMA "{namespace.schema}" CASCADE')
    finally:
        await conn.close()
    return (
        f"Reset the dev ledger schema {namespace.schema}: it was built from a log the broker no "
        f"longer holds ({gone}). The next projector starts it afresh from the broker's log."
    )


async def _log_gone(
    bootstrap: str, topic: str, epochs: set[uuid.UUID], partitions: set[int]
) -> str | None:
    """Why the log of `epochs` is not the broker's `topic`, or None when it still is."""
    from toolledger.events.kafka import KafkaLog

    log = KafkaLog(bootstrap, topic, client_id="toolledger-devstack", request_timeout_ms=10_000)
    await log.start()
    try:
        identity = await log.identity()
    except TopicMissing:
        return f"{topic} does not exist"
    except LogIdentityError as exc:
        return str(exc).split(";")[0]
    except LogError:
        return None
    finally:
        await log.close()
    if identity.epoch not in epochs or identity.partitions not in partitions:
        return f"{topic} is another log, of epoch {identity.epoch}"
    return None
