"""Audit: a key's or a run's story told from the log itself, and the ledger as of a time.

An auditor should not have to trust the projection to learn what was asked: `story()` reads the
run's partition of `toolledger.events` from offset 1, decodes every request of the key (or run),
and pairs each with the verdict the projector recorded for its event_id. A request the ledger
never decided shows as "no verdict", which is itself a finding. Payloads that travel by
reference are restored from the store's blobs and checked against their digests; a missing or
altered blob is reported on its entry (`payload_problem`), which is a finding too.

`as_of_targets()` finds, per partition, the first offset appended after a given time, so
`replay(..., targets=...)` can rebuild the ledger exactly as it stood then.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

from toolledger.events.codec import DecodeError, decode
from toolledger.events.fold import actor_of
from toolledger.events.log import EventLog, partition_for
from toolledger.events.models import Event
from toolledger.events.payloads import PayloadUnavailable, event_blobs, restore_event
from toolledger.events.records import Verdict
from toolledger.projections.store import LedgerStore


@dataclass(frozen=True)
class AuditEntry:
    """One request of the story: where it is in the log, who made it, what the ledger said."""

    partition: int
    offset: int
    appended_at: datetime
    event: Event
    actor: str
    verdict: Verdict | None
    payload_problem: str | None = None


async def _scan(
    log: EventLog, partitions: dict[int, int], idle: float = 0.5
) -> dict[int, list[tuple[int, int, bytes, bytes | None]]]:
    """Every record of the given partitions from the given offsets until the log goes quiet.

    (offset, timestamp_ms, value, key) per partition. The end of the log is found by reading,
    not by asking the broker for end offsets (unreliable on the local broker).
    """
    reader = log.reader()
    out: dict[int, list[tuple[int, int, bytes, bytes | None]]] = {p: [] for p in partitions}
    try:
        await reader.assign(partitions)
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while loop.time() - quiet_since < idle:
            batches = await reader.fetch(max_wait=0.1)
            for partition, records in batches.items():
                for r in records:
                    if not r.is_epoch_marker:
                        out[partition].append((r.offset, r.timestamp_ms, r.value, r.key))
            if batches:
                quiet_since = loop.time()
    finally:
        await reader.close()
    return out


async def story(
    log: EventLog, store: LedgerStore, *, run_id: str, key: str | None = None
) -> list[AuditEntry]:
    """Every request of `key` (or of the whole run when key is None), in log order."""
    partition = partition_for(run_id, await log.partition_count())
    records = (await _scan(log, {partition: 1}))[partition]
    events: list[tuple[int, int, Event]] = []
    for offset, ts, value, record_key in records:
        if record_key != run_id.encode():
            continue
        try:
            event = decode(value)
        except DecodeError:
            continue
        if key is None or event.key == key:
            events.append((offset, ts, event))
    verdicts = await store.verdicts([e.event_id for _, _, e in events])
    blobs = await store.get_blobs({d for _, _, e in events for d in event_blobs(e)})
    entries = []
    for offset, ts, event in events:
        problem = None
        try:
            shown = restore_event(event, blobs)
        except PayloadUnavailable as exc:
            shown, problem = event, str(exc)
        entries.append(
            AuditEntry(
                partition=partition,
                offset=offset,
                appended_at=datetime.fromtimestamp(ts / 1000, UTC),
                event=shown,
                actor=actor_of(event),
                verdict=verdicts.get(event.event_id),
                payload_problem=problem,
            )
        )
    return entries


async def as_of_targets(log: EventLog, as_of: datetime) -> dict[int, int]:
    """Per partition, the first offset appended after `as_of` (replay stops before it)."""
    cutoff_ms = int(as_of.timestamp() * 1000)
    count = await log.partition_count()
    scanned = await _scan(log, dict.fromkeys(range(count), 1))
    targets: dict[int, int] = {}
    for partition, records in scanned.items():
        target = records[-1][0] + 1 if records else 1
        for offset, ts, _, _ in records:
            if ts > cutoff_ms:
                target = offset
                break
        targets[partition] = target
    return targets
