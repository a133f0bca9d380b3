"""The projector's own CPU per event: decode and fold, without PostgreSQL or Kafka.

    python -m benchmarks.fold_rate [--events 20000] [--repeat 5] [--baseline REV]

Catch-up and replay both spend most of their CPU decoding records and folding them
(BENCHMARKS.md, issue 16): this isolates that part. A log of `--events` records is made once
(runs of ten calls, each call reserved and completed, a run checkpointed before its calls, as
`AgentRun` drives them), encoded as the runtime encodes it; each repetition then decodes every
record with the projector's `decode_records` and folds the batch with `fold_batch`, as a store
does, from an empty ledger, in batches of 2,000, the collector paused per batch as the
projector pauses it. The figure is `time.process_time()` per event;
at that cost one core folds `1e6 / cost` events per second, the ceiling of catch-up and replay.

The floor is fastavro reading the same records' bodies (`unframe`) alone. It checks its work:
every event accepted, and the decoded fold's digest equal to the digest of folding the events
as they were built, before encoding.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

from benchmarks._baseline import add_arguments, child_output, compare
from benchmarks._support import Row, median, say, table
from toolledger.events.codec import default_codec, encode, unframe
from toolledger.events.fold import LedgerFold, Positioned
from toolledger.events.log import LogRecord
from toolledger.events.models import (
    CallCompleted,
    CallReserved,
    Event,
    RunCheckpointed,
    RunStarted,
    args_digest,
)
from toolledger.events.signing import VerifyKeys
from toolledger.projections.decoding import decode_records
from toolledger.projections.gc_pause import gc_paused
from toolledger.projections.store import fold_batch

BATCH = 2000
CALLS_PER_RUN = 10
GOAL = "<= 40 us (25,000 events/s)"


def _run_events(run: int, at: datetime) -> list[Event]:
    run_id = f"run{run}"
    calls = [f"c{n}" for n in range(CALLS_PER_RUN)]
    events: list[Event] = [
        RunStarted(key=run_id, run_id=run_id, tenant_id="bench", occurred_at=at, agent="bench"),
        RunCheckpointed(
            key=run_id,
            run_id=run_id,
            tenant_id="bench",
            occurred_at=at,
            expected_version=0,
            tool_call_ids=tuple(calls),
            state_json='{"messages":[]}',
        ),
    ]
    for n, call in enumerate(calls):
        arguments = {"n": n}
        envelope = {
            "key": f"{run_id}:{call}",
            "run_id": run_id,
            "tool_call_id": call,
            "tenant_id": "bench",
            "occurred_at": at,
        }
        reserved = CallReserved(
            **envelope,
            run_version=1,
            tool="bench.noop",
            effect="external",
            args_digest=args_digest(arguments),
            arguments_json=json.dumps(arguments),
            deadline=at + timedelta(seconds=30),
        )
        events.append(reserved)
        events.append(
            CallCompleted(**envelope, reservation_id=reserved.reservation_id, result_json=str(n))
        )
    return events


def make_log(events: int) -> list[Event]:
    """About `events` events: whole runs of checkpointed calls, reserved then completed."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    per_run = 2 + 2 * CALLS_PER_RUN
    out: list[Event] = []
    for run in range(max(1, events // per_run)):
        out.extend(_run_events(run, at))
    return out


def _records(events: list[Event]) -> list[LogRecord]:
    return [
        LogRecord(0, offset, event.run_id.encode(), encode(event), 0)
        for offset, event in enumerate(events, start=1)
    ]


def _decode_and_fold(records: list[LogRecord]) -> LedgerFold:
    """Decode and fold `records` in batches as a store does; the resulting ledger."""
    keys = VerifyKeys()
    ledger = LedgerFold(keys=keys)
    for start in range(0, len(records), BATCH):
        with gc_paused():  # as the projector applies a batch
            batch = decode_records(0, records[start : start + BATCH], start + 1, keys)
            outcome = fold_batch(batch.items, ledger.calls, ledger.runs, (), keys, ledger.heads)
        ledger.calls.update((c.key, c) for c in outcome.calls)
        ledger.runs.update((r.run_id, r) for r in outcome.runs)
        ledger.heads.update(outcome.heads)
        ledger.history.extend(outcome.history)
        ledger.verdicts.update((v.event_id, v) for v in outcome.verdicts)
        rejected = [v for v in outcome.verdicts if not v.accepted]
        if rejected:
            raise RuntimeError(f"{len(rejected)} events rejected, first: {rejected[0].detail}")
    return ledger


def _expected_digest(events: list[Event]) -> str:
    fold = LedgerFold()
    for offset, event in enumerate(events, start=1):
        fold.apply(Positioned(0, offset, event))
    return fold.digest()


def _floor(records: list[LogRecord]) -> float:
    registry = default_codec().registry
    started = time.process_time()
    for record in records:
        unframe(registry, record.value)
    return (time.process_time() - started) / len(records)


def _repetition(records: list[LogRecord], expected: str) -> tuple[float, float]:
    """(decode + fold, floor) CPU seconds per event; checks the folded digest."""
    floor = _floor(records)
    started = time.process_time()
    ledger = _decode_and_fold(records)
    spent = (time.process_time() - started) / len(records)
    if len(ledger.verdicts) != len(records) or ledger.digest() != expected:
        raise RuntimeError(
            f"the decoded fold differs from the fold of the events as built: "
            f"{len(ledger.verdicts)} verdicts for {len(records)} records"
        )
    return spent, floor


def measure(*, events: int, repeat: int) -> list[Row]:
    log = make_log(events)
    records = _records(log)
    expected = _expected_digest(log)
    costs: list[float] = []
    floors: list[float] = []
    for rep in range(repeat):
        cost, floor = _repetition(records, expected)
        costs.append(cost * 1e6)
        floors.append(floor * 1e6)
        say(
            f"  {rep + 1}/{repeat}: decode + fold {costs[-1]:.1f} us CPU per event "
            f"({1e6 / costs[-1]:,.0f} events/s), Avro read alone {floors[-1]:.1f} us"
        )
    note = (
        f"{len(records)} events (runs of {CALLS_PER_RUN} checkpointed calls) x {repeat} "
        f"repetitions, batches of {BATCH}, from an empty ledger; medians"
    )
    value = median(costs)
    return [
        Row("decode + fold", "CPU per event", value, "us", median(floors), "Avro read", GOAL, note),
        Row("decode + fold", "events/s on one core", 1e6 / value, "ev/s", None, "", ">= 25,000"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fold_rate", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000, help="events in the log")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.events < 100 or args.repeat < 1:
        parser.error("--events >= 100 and --repeat >= 1, please")
    if args.child:
        log = make_log(args.child)
        print(child_output(*_repetition(_records(log), _expected_digest(log))))
    elif args.baseline:
        compare(
            "benchmarks.fold_rate",
            args.events,
            args.baseline,
            args.repeat,
            "decode + fold CPU per event",
        )
    else:
        print(table(measure(events=args.events, repeat=args.repeat)))


if __name__ == "__main__":  # no services needed
    main()
