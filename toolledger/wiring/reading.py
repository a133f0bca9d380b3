"""The ledger's reads, fresh, for a command that builds no stack (`toolledger history`, `audit`).

A `LedgerStack` opens a producer, a LISTEN connection and a waiter that a command printing one
key's history never uses. `reading(settings)` opens only what the read barrier needs
(`toolledger.projections.barrier`): the events topic, for its end offsets, and one PostgreSQL
connection for the committed positions, beside the store itself. A history printed right after a
runtime was answered then shows that answer's events, whichever process the runtime ran in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolledger.projections.barrier import ReadBarrier
from toolledger.projections.fresh import FreshReads
from toolledger.settings import Settings

if TYPE_CHECKING:
    from toolledger.events.kafka import KafkaLog


@dataclass(frozen=True)
class Reading:
    """What `reading` opened: the fresh reads, and the events topic they wait on."""

    reads: FreshReads
    log: KafkaLog


@asynccontextmanager
async def reading(settings: Settings) -> AsyncIterator[Reading]:
    """The ledger of `settings`, read behind the barrier; everything closed on the way out."""
    from toolledger.events.kafka import KafkaLog
    from toolledger.projections.postgres import PostgresLedger
    from toolledger.projections.postgres_reads import PostgresReads

    database_url, bootstrap = settings.require_services()
    log = KafkaLog(bootstrap, settings.events_topic)
    # A reader never builds the ledger: a mistyped schema is refused (SchemaMissing).
    store = PostgresLedger(database_url, settings.schema_name, create=False)
    positions = PostgresReads(database_url, settings.schema_name)
    barrier = ReadBarrier(log, positions, timeout=settings.read_barrier_timeout_s)
    try:
        await store.start()
        await log.start()
        yield Reading(FreshReads(store, barrier), log)
    finally:
        await barrier.close()
        await positions.close()
        await store.close()
        await log.close()
