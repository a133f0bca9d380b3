"""The reconciler's table of unsettled calls, folded from facts: pure functions.

The reconciler keeps one table entry per run (the facts topic's key, so the table is
co-partitioned with it and needs no repartition topic): the latest record of every call of that
run that is `indeterminate` or `started`. Each *accepted* fact carries the call's record after
the verdict; an unsettled one is put, any other status removes the call, and a run without
unsettled calls has no entry at all. Rejected facts changed nothing in the ledger, so they change
nothing here either.

Facts are published at least once: a projector that takes a partition over republishes the facts
after the last position it recorded, in their original order. A record is therefore applied only
if it is newer (a higher version) than the one held, and a repeated older fact that re-adds a
settled call is removed again when the repeat of its settling fact follows.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from toolledger.events.records import UNSETTLED, CallRecord
from toolledger.projections.facts import Fact, facts_in


class UnsettledRun(BaseModel):
    """A run's unsettled calls by key, and the facts partition the run lives in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: int
    calls: dict[str, CallRecord]


def fold_fact(entry: UnsettledRun | None, fact: Fact, partition: int) -> UnsettledRun | None:
    """The run's entry after `fact` (read from `partition`); None when it has no unsettled call.

    Returns `entry` itself when the fact changes nothing, so callers can skip the table write.
    """
    record = fact.verdict.call
    if not fact.verdict.accepted or record is None:
        return entry
    held = entry.calls.get(record.key) if entry is not None else None
    if held is not None and held.version >= record.version:
        return entry
    calls = dict(entry.calls) if entry is not None else {}
    if record.status in UNSETTLED:
        calls[record.key] = record
    elif held is None:
        return entry
    else:
        del calls[record.key]
    if not calls:
        return None
    return UnsettledRun(partition=entry.partition if entry else partition, calls=calls)


def parse_facts(value: bytes) -> list[Fact] | None:
    """The facts in a facts-topic record (packed or single), or None for bytes that are not."""
    try:
        return facts_in(value)
    except ValidationError:
        return None
