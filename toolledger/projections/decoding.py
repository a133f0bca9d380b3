"""Decoding a partition's records for the fold, shared by the projector and replay.

Both must fold exactly the same items, so both call `decode_records`: it decodes records from a
start offset, turns undecodable bytes into dead letters, and stops before a record this process
cannot judge, leaving the partition halted there. Two kinds of record stop it: one of an unknown
schema fingerprint ("deploy readers before writers"), and an operator event signed with a key id
not in the verifier's public keys ("deploy keys before signers", docs/security.md). Folding
around either would make the ledger depend on which version or keys a process happened to have.

A hole halts it too. The events topic is neither compacted nor written with transactions, so
its offsets are contiguous; the Kafka reader already waits out a record that is assigned but
not yet readable (`toolledger.events.kafka.Contiguous`), so a hole that reaches the fold is
one the broker will not fill, and folding past it would decide later events without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from toolledger.events.codec import DecodeError, decode
from toolledger.events.fold import DeadLetter, Folded, Positioned
from toolledger.events.log import LogRecord
from toolledger.events.models import Event, OperatorEvent
from toolledger.events.signing import UnknownSigningKey, VerifyKeys
from toolledger.projections.following import Proven
from toolledger.projections.gc_pause import gc_paused


def run_id_of(key: bytes | None) -> str | None:
    """The run a record's key names, if it names one (for quarantining dead letters)."""
    if not key:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    return text if ":" not in text else None


@dataclass
class DecodedBatch:
    """A partition's fetched records, decoded: what to apply, and where the batch ends."""

    items: list[Positioned | DeadLetter]
    dead: list[DeadLetter]
    next_offset: int
    #: Why the batch stops before a record this process cannot judge, as a projector says it
    #: (it halts the partition there) and as a replay does (it halts nothing: it stops).
    halted: str | None = None
    stopped: str | None = None

    def stop(self, what: str, halt: str, replay: str) -> None:
        self.halted, self.stopped = what + halt, what + replay


def decode_records(
    partition: int,
    records: Sequence[LogRecord],
    start: int,
    keys: VerifyKeys,
    decode: Callable[[bytes], Event] = decode,
) -> DecodedBatch:
    """Decode records from offset `start` on; stop before a record this process cannot judge:
    one of an unknown schema, or an operator event signed with a key id not in `keys`.

    Shared by the projector and replay so both fold exactly the same items.
    """
    with gc_paused():
        return _decode_records(partition, records, start, keys, decode)


def _decode_records(
    partition: int,
    records: Sequence[LogRecord],
    start: int,
    keys: VerifyKeys,
    decode: Callable[[bytes], Event],
) -> DecodedBatch:
    batch = DecodedBatch(items=[], dead=[], next_offset=start)
    for record in records:
        if record.offset < batch.next_offset:
            continue
        if record.offset > batch.next_offset:
            _hole(batch, partition, record.offset)
            break
        if record.is_epoch_marker:
            batch.next_offset = record.offset + 1
            continue
        try:
            event = decode(record.value)
            if run_id_of(record.key) != event.run_id:
                raise ValueError(
                    f"malformed: record key {record.key!r} is not the event's run_id "
                    f"{event.run_id!r}"
                )
        except DecodeError as err:
            if err.reason == "unknown_fingerprint":
                batch.stop(
                    f"partition {partition} offset {record.offset}: {err}",
                    " The partition is halted; upgrade this projector to a version that knows "
                    "the schema",
                    " The replay stopped there; run it with a version that knows the schema",
                )
                break
            batch.dead.append(_dead(partition, record, str(err)))
        except ValueError as err:
            batch.dead.append(_dead(partition, record, str(err)))
        else:
            unknown = _unknown_signer(event, keys)
            if unknown is not None:
                batch.stop(
                    f"partition {partition} offset {record.offset}: {unknown}",
                    ". The partition is halted until then",
                    ". The replay stopped there (a replay halts nothing)",
                )
                break
            batch.items.append(Positioned(partition, record.offset, event))
            batch.next_offset = record.offset + 1
            continue
        batch.items.append(batch.dead[-1])
        batch.next_offset = record.offset + 1
    return batch


def _hole(batch: DecodedBatch, partition: int, found: int) -> None:
    batch.stop(
        f"partition {partition} offset {batch.next_offset}: the log has no record there "
        f"but has one at {found}. The events topic must not be compacted or "
        "written with transactions",
        "; the partition is halted before the hole",
        "; the replay stopped before the hole",
    )


def decode_entries(
    partition: int,
    entries: Sequence[LogRecord | Proven],
    start: int,
    keys: VerifyKeys,
    decode: Callable[[bytes], Event] = decode,
) -> tuple[DecodedBatch, dict[int, Folded]]:
    """`decode_records` for a projector's batch of fetched records and records its follower
    handed over already decoded and folded (`Proven`), in offset order: the fetched ones are
    decoded, the handed ones taken as they are. Also returns the handed ones' fold results,
    by offset."""
    batch = DecodedBatch(items=[], dead=[], next_offset=start)
    handed: dict[int, Folded] = {}
    at = 0
    while at < len(entries) and batch.halted is None:
        entry = entries[at]
        if not isinstance(entry, Proven):
            end = at
            while end < len(entries) and not isinstance(entries[end], Proven):
                end += 1
            fetched = [e for e in entries[at:end] if isinstance(e, LogRecord)]
            part = decode_records(partition, fetched, batch.next_offset, keys, decode)
            batch.items += part.items
            batch.dead += part.dead
            batch.next_offset = part.next_offset
            batch.halted, batch.stopped = part.halted, part.stopped
            at = end
            continue
        at += 1
        if entry.offset < batch.next_offset:
            continue
        if entry.offset > batch.next_offset:
            _hole(batch, partition, entry.offset)
            break
        item = entry.folded.item
        batch.items.append(item)
        if isinstance(item, DeadLetter):
            batch.dead.append(item)
        handed[entry.offset] = entry.folded
        batch.next_offset = entry.offset + 1
    return batch, handed


def _unknown_signer(event: Event, keys: VerifyKeys) -> UnknownSigningKey | None:
    """Why `event` cannot be judged with `keys` (its signer's key id is unknown), if so."""
    if not isinstance(event, OperatorEvent) or event.signature is None:
        return None
    if keys.knows(event.signature.key_id):
        return None
    return UnknownSigningKey(event.key, event.signature.key_id, keys.raw)


def _dead(partition: int, record: LogRecord, reason: str) -> DeadLetter:
    return DeadLetter(partition, record.offset, run_id_of(record.key), reason, record.value)
