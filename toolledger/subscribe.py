"""Subscriptions for analytics: a typed async iterator over decided facts.

Analytics consume `toolledger.ledger` (facts), never the requests: every fact is a verdict the
projector reached, so a subscriber never counts an event the ledger rejected as if it had
happened. Facts are published at least once, so a subscription drops repeats by event_id. The
projector packs several facts into one record (`toolledger.projections.facts`); a subscription
yields facts one by one and reads records written before packing too.

Three ways to start:

- `subscribe(facts_log)` reads every partition from the beginning (memory or Kafka);
- `subscribe(facts_log, since=t)` the same, skipping facts of requests that occurred before t
  (a scan, not a broker time lookup: the local broker's offset lookups are unreliable);
- `subscribe_group(settings, group_id)` joins a Kafka consumer group and resumes from the
  group's committed offsets, committing as the caller consumes.

`requests(events_log)` yields the decoded requests themselves, for the rare consumer that wants
what was asked rather than what was decided.

Nobody hints a subscriber that facts were published, so an idle subscription on Kafka backs off
to `TOOLLEDGER_IDLE_FETCH_BOUND_MS` between fetches (`toolledger.events.pacing`), and a fact
published to an idle subscription reaches it within that bound.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from dataclasses import dataclass
from datetime import datetime

from aiokafka import AIOKafkaConsumer

from toolledger.events.codec import DecodeError, decode
from toolledger.events.kafka_idle import IdleConsumer
from toolledger.events.log import EventLog
from toolledger.events.models import Event
from toolledger.events.pacing import IdleBackoff
from toolledger.projections.facts import Fact, facts_in
from toolledger.settings import Settings

__all__ = ["Fact", "FactFilter", "requests", "subscribe", "subscribe_group"]


@dataclass(frozen=True)
class FactFilter:
    """Which facts a subscriber wants; None means any."""

    tenants: Collection[str] | None = None
    tools: Collection[str] | None = None
    event_types: Collection[str] | None = None
    accepted_only: bool = False
    since: datetime | None = None

    def wants(self, fact: Fact) -> bool:
        v = fact.verdict
        tenant = v.call.tenant_id if v.call is not None else (v.run.tenant_id if v.run else None)
        if self.tenants is not None and tenant not in self.tenants:
            return False
        if self.tools is not None and (v.call is None or v.call.tool not in self.tools):
            return False
        if self.event_types is not None and v.event_type not in self.event_types:
            return False
        if self.accepted_only and not v.accepted:
            return False
        return self.since is None or fact.occurred_at >= self.since


class _Seen:
    """The most recent event_ids delivered, to drop at-least-once repeats."""

    def __init__(self, size: int = 100_000) -> None:
        self._ids: OrderedDict[object, None] = OrderedDict()
        self._size = size

    def first_time(self, event_id: object) -> bool:
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)
        return True


def _facts(value: bytes | None) -> list[Fact]:
    """The facts in a record, none for bytes that are not facts (skipped, as before)."""
    try:
        return facts_in(value) if value else []
    except ValueError:
        return []


async def subscribe(
    facts: EventLog,
    *,
    since: datetime | None = None,
    tenants: Collection[str] | None = None,
    tools: Collection[str] | None = None,
    event_types: Collection[str] | None = None,
    accepted_only: bool = False,
    follow: bool = True,
    idle_timeout: float = 1.0,
) -> AsyncIterator[Fact]:
    """Every fact from the beginning of `facts`, in log order per run (hence per key).

    With `follow=False` the iterator ends once no new fact arrived for `idle_timeout` seconds
    (a batch job's "caught up"); otherwise it waits for new facts forever.
    """
    wanted = FactFilter(tenants, tools, event_types, accepted_only, since)
    seen = _Seen()
    reader = facts.reader()
    try:
        await reader.assign(dict.fromkeys(range(await facts.partition_count()), 0))
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while True:
            batches = await reader.fetch(max_wait=0.1)
            got = False
            for records in batches.values():
                for record in records:
                    got = True
                    for fact in _facts(record.value):
                        if seen.first_time(fact.verdict.event_id) and wanted.wants(fact):
                            yield fact
            if got:
                quiet_since = loop.time()
            elif not follow and loop.time() - quiet_since >= idle_timeout:
                return
    finally:
        await reader.close()


async def subscribe_group(
    settings: Settings,
    group_id: str,
    *,
    tenants: Collection[str] | None = None,
    tools: Collection[str] | None = None,
    event_types: Collection[str] | None = None,
    accepted_only: bool = False,
    session_timeout_ms: int = 6000,
) -> AsyncGenerator[Fact, None]:
    """Facts for a consumer group: starts where the group left off (the beginning the first
    time) and commits each record's offset once the caller asks for the fact after its last
    one, so a crash redelivers at most the record (the pack of facts) being handled.

    A caller that stops early should close it (`contextlib.aclosing`): the consumer then leaves
    its group at once, not whenever the abandoned generator is collected."""
    _, bootstrap = settings.require_services()
    wanted = FactFilter(tenants, tools, event_types, accepted_only)
    seen = _Seen()
    consumer = AIOKafkaConsumer(
        settings.facts_topic,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_wait_ms,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=max(session_timeout_ms // 3, 100),
    )
    paced = IdleConsumer(consumer, IdleBackoff(settings.idle_fetch_bound_ms / 1000))
    try:
        await consumer.start()
        while True:
            batches = await paced.getmany(timeout_ms=100)
            for tp, records in batches.items():
                for record in records:
                    for fact in _facts(record.value):
                        if seen.first_time(fact.verdict.event_id) and wanted.wants(fact):
                            yield fact
                    await consumer.commit({tp: record.offset + 1})
    finally:
        await consumer.stop()


async def requests(
    events: EventLog, *, follow: bool = False, idle_timeout: float = 1.0
) -> AsyncIterator[Event]:
    """The decoded requests of the events topic from offset 1, in log order per partition;
    undecodable records are skipped (they are in the dead letters)."""
    reader = events.reader()
    try:
        await reader.assign(dict.fromkeys(range(await events.partition_count()), 0))
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while True:
            batches = await reader.fetch(max_wait=0.1)
            for records in batches.values():
                for record in records:
                    if record.is_epoch_marker:
                        continue
                    try:
                        yield decode(record.value)
                    except DecodeError:
                        continue
            if batches:
                quiet_since = loop.time()
            elif not follow and loop.time() - quiet_since >= idle_timeout:
                return
    finally:
        await reader.close()
