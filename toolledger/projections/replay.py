"""Replay: re-fold the events topic from offset 0 into a fresh schema, and compare.

Dropping the projection and replaying the log must give the same ledger: the same records, the
same history with the same verdicts, the same digest. `replay()` folds with the very code the
projector uses (`decode_records` and `LedgerStore.apply_batch`), up to the offsets the live
ledger has reached, so a comparison with the live ledger is exact even while it keeps running
(the live side is re-read at the same offsets until both agree or a real difference remains).

The fold needs no payload blobs (events and records carry digests, `toolledger.events.payloads`),
so a replay gives the same digest whether or not they survive; `copy_blobs` then brings the
blobs the replayed history names over from the live store, checked against their digests, so
the new schema can serve the texts too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from toolledger.errors import ToolLedgerError
from toolledger.events.fold import broken_chains
from toolledger.events.log import EventLog, LogIdentity, LogIdentityError, LogRecord
from toolledger.events.payloads import OFFLOADABLE, digest_of
from toolledger.projections.decoding import decode_records
from toolledger.projections.gc_pause import gc_paused
from toolledger.projections.store import LedgerSnapshot, LedgerStore

Progress = Callable[[int, int], None]
_log = logging.getLogger("toolledger.replay")


@dataclass
class ReplayReport:
    """What a replay folded and, with verification, how it compares with the live ledger."""

    events: int = 0
    dead_letters: int = 0
    targets: dict[int, int] = field(default_factory=dict)
    replay_digest: str = ""
    live_digest: str | None = None
    differences: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return (
            self.live_digest is not None
            and self.live_digest == self.replay_digest
            and not self.differences
        )


async def replay(
    log: EventLog,
    into: LedgerStore,
    *,
    targets: dict[int, int],
    progress: Progress | None = None,
    batch_size: int = 5000,
) -> ReplayReport:
    """Fold every partition of `log` from offset 1 up to (excluding) `targets[p]` into `into`.

    `into` must be empty; `targets` usually comes from the live ledger's stored offsets.
    Operator signatures are checked with `into.verify_keys`; an operator event signed with a
    key id not among them stops the replay (`LogIdentityError` saying so) rather than fold a
    verdict that would depend on which keys this process has.
    """
    identity = await bind_empty(log, into)
    report = ReplayReport(targets=dict(targets))
    wanted = {p: targets[p] for p in range(identity.partitions) if p in targets}
    report.events, report.dead_letters = await fold_partitions(
        log, into, wanted, progress=progress, batch_size=batch_size
    )
    report.replay_digest = await into.digest()
    return report


class ReplayStopped(LogIdentityError):
    """A replay met a record it cannot judge (an unknown key id or schema, a hole) and stopped
    there; unlike a projector it halts nothing, so it says so in its own words."""

    code = "replay_stopped"


class ReplayTargetInUse(ToolLedgerError, ValueError):
    """A replay was pointed at a store that already holds a projection: a usage error (pick a
    new schema), not a log that differs from the ledger's."""

    code = "replay_target_in_use"


async def bind_empty(log: EventLog, into: LedgerStore) -> LogIdentity:
    """Bind `into` to the log's identity; `ReplayTargetInUse` unless it holds no projection."""
    identity = await log.identity()
    try:
        states = await into.bind_log(identity)
    except LogIdentityError as exc:  # bound to another log: in use all the same
        raise ReplayTargetInUse(
            f"the replay target already holds a projection of another log ({exc}); replay "
            "into a new, empty schema"
        ) from exc
    if any(state.next_offset != 1 for state in states.values()):
        raise ReplayTargetInUse(
            "the replay target already holds a projection; replay into a new, empty schema"
        )
    return identity


async def fold_partitions(
    log: EventLog,
    into: LedgerStore,
    targets: Mapping[int, int],
    *,
    progress: Progress | None = None,
    batch_size: int = 5000,
) -> tuple[int, int]:
    """Fold the partitions named by `targets` from offset 1 up to (excluding) `targets[p]` into
    `into`, which `bind_empty` bound; the events folded and the dead letters met.

    Partitions are independent in the store (every row of a run, and so of its calls, comes
    from the run's one partition), so disjoint sets of them may be folded into one store by
    several processes at once (`toolledger.projections.replay_processes`).
    """
    events = dead_letters = 0
    position = {p: 1 for p, target in targets.items() if target > 1}
    total = sum(targets[p] - 1 for p in position)
    reader = log.reader()
    try:
        await reader.assign(position)
        while position:
            batches = await reader.fetch(max_wait=0.2, max_records=batch_size)
            _log.debug(
                "replay at %s; fetched %s",
                position,
                {p: (r[0].offset, r[-1].offset) for p, r in batches.items() if r},
            )
            finished = False
            for partition, records in batches.items():
                if partition not in position:
                    continue
                limit = targets[partition]
                wanted = [r for r in records if r.offset < limit]
                # As in the projector: the batch's objects are gone before collection resumes,
                # so no collection walks them (`gc_pause` says why that matters).
                with gc_paused():
                    reached, folded, dead = await _fold(
                        into, partition, wanted, position[partition]
                    )
                if reached > position[partition]:
                    events += folded
                    dead_letters += dead
                    done = reached - position[partition]
                    position[partition] = reached
                    if progress is not None:
                        progress(done, total)
                if position[partition] >= limit:
                    del position[partition]
                    finished = True
            if finished:
                # Only once the whole batch is applied: re-seeking mid-batch would rewind the
                # partitions not yet processed to their old offsets.
                await reader.assign(position)
    finally:
        await reader.close()
    return events, dead_letters


async def _fold(
    into: LedgerStore, partition: int, records: list[LogRecord], start: int
) -> tuple[int, int, int]:
    """Decode and apply one partition's records from `start`: the offset reached, how many
    verdicts the batch had, and how many dead letters."""
    batch = decode_records(partition, records, start, into.verify_keys)
    if batch.stopped is not None:
        raise ReplayStopped(batch.stopped)
    if batch.next_offset <= start:
        return start, 0, 0
    verdicts = await into.apply_batch(partition, start, batch.next_offset, batch.items)
    return batch.next_offset, len(verdicts), len(batch.dead)


def shown(value: object) -> str:
    """A field's value as an operator reads it: `2026-11-30T10:00:00+00:00`, not
    `datetime.datetime(2026, 11, 30, 10, 0, tzinfo=datetime.timezone.utc)`."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        return value or "''"
    return str(value)


_BLOB_FIELDS = frozenset(blob for pairs in OFFLOADABLE.values() for _, blob in pairs)


def referenced_blobs(snapshot: LedgerSnapshot) -> set[str]:
    """Every digest the history of `snapshot` names (records only copy digests from it)."""
    found: set[str] = set()
    for entry in snapshot.history:
        if '_blob":' in entry.event_json:
            event = json.loads(entry.event_json)
            found.update(event[f] for f in _BLOB_FIELDS if isinstance(event.get(f), str))
    return found


async def copy_blobs(source: LedgerStore, into: LedgerStore) -> list[str]:
    """Copy the blobs `into`'s history references from `source`; what could not be copied
    (missing in `source`, or not matching its digest), one sentence each."""
    wanted = referenced_blobs(await into.snapshot())
    found = await source.get_blobs(wanted)
    good = {d: data for d, data in found.items() if digest_of(data) == d}
    await into.put_blobs(good)
    problems = [
        f"blob {d} is named by the log but missing from the live ledger's payload_blobs"
        for d in sorted(wanted - set(found))
    ]
    problems += [
        f"blob {d} in the live ledger's payload_blobs does not match its digest"
        for d in sorted(set(found) - set(good))
    ]
    return problems


def compare(live: LedgerSnapshot, replayed: LedgerSnapshot, limit: int = 20) -> list[str]:
    """Human-readable differences between two ledgers (empty when identical).

    The live history's hash chains are recomputed first (`broken_chains`), so a removed,
    altered or reordered entry is named by its key and position even where the row-by-row
    comparison below only sees rows that moved.
    """
    out: list[str] = broken_chains(live.history, limit)
    for what, left, right in (
        ("record", live.calls, replayed.calls),
        ("run", live.runs, replayed.runs),
    ):
        for key in sorted(set(left) | set(right)):
            a, b = left.get(key), right.get(key)
            if a == b:
                continue
            if a is None or b is None:
                side = "replay" if a is None else "live ledger"
                out.append(f"{what} {key} exists only in the {side}")
                continue
            fields = [
                f"{name}: live {shown(getattr(a, name))} != replay {shown(getattr(b, name))}"
                for name in type(a).model_fields
                if getattr(a, name) != getattr(b, name)
            ]
            out.append(f"{what} {key} differs: " + "; ".join(fields))
    live_h = {(h.partition, h.offset): h for h in live.history}
    replay_h = {(h.partition, h.offset): h for h in replayed.history}
    for pos in sorted(set(live_h) | set(replay_h)):
        ha, hb = live_h.get(pos), replay_h.get(pos)
        if ha != hb:
            where = f"history at partition {pos[0]} offset {pos[1]}"
            if ha is None or hb is None:
                side = "replay" if ha is None else "live ledger"
                out.append(f"{where} exists only in the {side}")
            else:
                fields = [n for n in type(ha).model_fields if getattr(ha, n) != getattr(hb, n)]
                out.append(f"{where} ({ha.key}) differs in {', '.join(fields)}")
    if live.dead_letters != replayed.dead_letters:
        out.append(f"dead letters: live {live.dead_letters} != replay {replayed.dead_letters}")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])
