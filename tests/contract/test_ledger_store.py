"""The LedgerStore contract: one suite, run against the memory and the PostgreSQL store.

Every case compares a store with `LedgerFold` folding the same log, the pure reference that
replay uses; so passing for both adapters is what proves PostgreSQL and memory agree.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import asyncpg
import pytest
from asyncpg.pool import PoolConnectionProxy

from tests import builders as b
from toolledger.events.fold import DeadLetter, HistoryEntry, LedgerFold, Positioned
from toolledger.events.log import LogIdentity, LogIdentityError
from toolledger.events.models import (
    CallAbandoned,
    CallApproved,
    CallCompensated,
    CallCompleted,
    CallFailed,
    CallIndeterminate,
    CallRejected,
    CallReserved,
    CallResolved,
    CompensationFailed,
    CompensationRequested,
    Event,
    OperatorEvent,
    Producer,
    ReconcileAttempted,
    RunCheckpointed,
    RunFinished,
    RunPaused,
    RunResumed,
    RunResumeFailed,
    RunStarted,
    args_digest,
    call_key,
    canonical_json,
)
from toolledger.events.payloads import digest_of
from toolledger.events.records import Verdict
from toolledger.events.signing import SigningKey, sign
from toolledger.port import CallQuery
from toolledger.projections.facts import Fact, facts_in, facts_of
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.migrations import load_migrations, migrate
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.store import (
    LedgerSnapshot,
    LedgerStore,
    OffsetConflict,
    PartitionState,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
A = Producer(host="runtime-a", pid=11)
B = Producer(host="runtime-b", pid=22)
KEY_ID = "api-1"
SIGNING_KEY = SigningKey.from_seed(KEY_ID, b"contract-operator-signing-key-32")
KEYS = SIGNING_KEY.verify_keys()
#: Another private key under the API's key id: what a forger without the key can do at best.
FORGER = SigningKey.from_seed(KEY_ID, b"\x07" * 32)
IDENTITY = LogIdentity("toolledger.events", uuid.UUID("5b0d6c1e-8a43-4c39-9a43-0c7a8e1f2d11"), 2)
ARGS = {"customer": "c-42", "amount_cents": 500}

E = TypeVar("E", bound=Event)
Op = TypeVar("Op", bound=OperatorEvent)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(
    cls: type[E], run_id: str, tool_call_id: str | None, when: datetime, **fields: object
) -> E:
    """A request of type `cls` with its envelope filled in (`tool_call_id` None: a run event).

    Producer A and tenant acme unless `fields` say otherwise.
    """
    key = run_id if tool_call_id is None else call_key(run_id, tool_call_id)
    envelope = {"key": key, "run_id": run_id, "tool_call_id": tool_call_id, "occurred_at": when}
    return cls.model_validate({"producer": A, "tenant_id": "acme", **envelope, **fields})


def reserve(
    run_id: str,
    tool_call_id: str,
    when: datetime,
    *,
    producer: Producer = A,
    tenant_id: str = "acme",
    arguments: dict[str, object] | None = None,
    run_version: int | None = None,
    requires_approval: bool = False,
    reservation_id: uuid.UUID | None = None,
    deadline: timedelta = timedelta(seconds=30),
) -> CallReserved:
    arguments = ARGS if arguments is None else arguments
    return event(
        CallReserved,
        run_id,
        tool_call_id,
        when,
        producer=producer,
        tenant_id=tenant_id,
        reservation_id=reservation_id or uuid.uuid4(),
        run_version=run_version,
        tool="billing.issue_credit",
        args_digest=args_digest(arguments),
        arguments_json=canonical_json(arguments),
        requires_approval=requires_approval,
        deadline=when + deadline,
    )


def outcome(cls: type[E], r: CallReserved, when: datetime, **fields: object) -> E:
    """An outcome (or any call event) for reservation `r`, from the process that reserved it."""
    return event(
        cls,
        r.run_id,
        r.tool_call_id,
        when,
        producer=r.producer,
        tenant_id=r.tenant_id,
        reservation_id=r.reservation_id,
        **fields,
    )


def completed(r: CallReserved, when: datetime) -> CallCompleted:
    return outcome(CallCompleted, r, when, result_json='{"credit":"cr-1"}')


def signed(e: Op, *, valid: bool = True) -> Op:
    """`e` signed by the operator API's key (or by a forger's key under the same key id)."""
    return sign(e, SIGNING_KEY if valid else FORGER)


@dataclass(frozen=True)
class Batch:
    partition: int
    start: int
    next: int
    items: list[Positioned | DeadLetter]


@dataclass
class Log:
    """Positions records as a partition of the events topic would, and folds the reference."""

    reference: LedgerFold = field(default_factory=lambda: LedgerFold(keys=KEYS))
    next_offset: dict[int, int] = field(default_factory=lambda: {0: 1, 1: 1})

    def batch(self, partition: int, *records: Event | tuple[str | None, bytes]) -> Batch:
        """`(run_id, payload)` stands for a record that could not be decoded."""
        start = self.next_offset[partition]
        items: list[Positioned | DeadLetter] = []
        for offset, record in enumerate(records, start=start):
            if isinstance(record, Event):
                items.append(Positioned(partition, offset, record))
            else:
                items.append(DeadLetter(partition, offset, record[0], "undecodable", record[1]))
        self.next_offset[partition] = start + len(items)
        return Batch(partition, start, start + len(items), items)

    def fold(self, batch: Batch) -> list[Verdict]:
        found = (self.reference.apply(item) for item in batch.items)
        return [v for v in found if v is not None]

    async def feed(
        self, store: LedgerStore, partition: int, *records: Event | tuple[str | None, bytes]
    ) -> list[Verdict]:
        """Apply a batch to the store and the reference; their verdicts must agree."""
        batch = self.batch(partition, *records)
        got = await store.apply_batch(batch.partition, batch.start, batch.next, batch.items)
        assert got == self.fold(batch)
        return got


async def assert_same_ledger(store: LedgerStore, reference: LedgerFold) -> None:
    """Every record, run, history row, verdict and dead letter equals the reference fold's."""
    for key, call in reference.calls.items():
        assert await store.get_call(key) == call, key
    for run_id, run in reference.runs.items():
        assert await store.get_run(run_id) == run, run_id
    by_key: dict[str, list[object]] = {}
    for entry in sorted(reference.history, key=lambda e: (e.partition, e.offset)):
        by_key.setdefault(entry.key, []).append(entry)
    for key, entries in by_key.items():
        assert await store.history(key) == entries, key
    assert await store.verdicts(list(reference.verdicts)) == reference.verdicts
    expected_dead = sorted(reference.dead_letters, key=lambda d: (d.partition, d.offset))
    assert await store.dead_letters() == expected_dead
    assert await store.snapshot() == LedgerSnapshot(
        calls=reference.calls,
        runs=reference.runs,
        history=sorted(reference.history, key=lambda e: (e.partition, e.offset)),
        dead_letters=len(reference.dead_letters),
    )
    assert await store.digest() == reference.digest()


class MixedLog:
    """A few hundred plausible and implausible requests over six runs in two partitions.

    Two runtimes reserve the same keys, outcomes arrive for old reservations, resends reuse
    event_ids, operators sign (or forge), drivers go stale, tenants collide, one record is
    undecodable. The reference fold is read only to make versions plausible, so that most
    requests get past the first check and reach the interesting rules.
    """

    RUNS = tuple(f"run{i}" for i in range(6))
    CALLS = ("c1", "c2", "c3", "c4")

    def __init__(self, seed: int, count: int = 400) -> None:
        self.rng = random.Random(seed)
        self.log = Log()
        self.clock = T0
        self.reservations: dict[str, list[CallReserved]] = {}
        self.tombstoned: dict[str, list[uuid.UUID]] = {}
        self.sent: dict[str, list[Event]] = {r: [] for r in self.RUNS}
        self.items: dict[int, list[Positioned | DeadLetter]] = {0: [], 1: []}
        dead_at = self.rng.randrange(count // 2, count)
        for n in range(count):
            self.clock += timedelta(microseconds=self.rng.randint(1, 4_000_000))
            run = self.rng.choice(self.RUNS)
            if n == dead_at:
                self._append(run, (run, b"\xc3\x01garbage"))
            elif self.sent[run] and self.rng.random() < 0.06:
                self._append(run, self.rng.choice(self.sent[run]))
            else:
                self._append(run, self._request(run, self.rng.choice(self.CALLS)))

    def batches(self, partition: int, sizes: tuple[int, int] = (1, 40)) -> list[Batch]:
        """The partition's records cut into batches of random sizes within `sizes`."""
        records, cut, i = self.items[partition], [], 0
        while i < len(records):
            chunk = records[i : i + self.rng.randint(*sizes)]
            i += len(chunk)
            cut.append(Batch(partition, chunk[0].offset, chunk[-1].offset + 1, chunk))
        return cut

    def _append(self, run: str, record: Event | tuple[str | None, bytes]) -> None:
        partition = self.RUNS.index(run) % 2
        batch = self.log.batch(partition, record)
        self.log.fold(batch)
        self.items[partition] += batch.items
        if isinstance(record, Event):
            self.sent[run].append(record)

    def _request(self, run_id: str, tc: str) -> Event:
        rng, when, key = self.rng, self.clock, call_key(run_id, tc)
        ref = self.log.reference
        call, run = ref.calls.get(key), ref.runs.get(run_id)
        tenant = "globex" if self.RUNS.index(run_id) % 3 == 0 else "acme"
        by = {"producer": rng.choice([A, B]), "tenant_id": tenant}
        kind = rng.choices(
            ["reserve", "outcome", "abandon", "reconcile", "operator", "compensation", "run"],
            [30, 22, 5, 8, 12, 4, 12],
        )[0]
        held = self.reservations.get(key, [])
        version = 0 if call is None else call.version - (rng.random() < 0.15)
        if kind == "outcome" and held:
            r = held[-1] if rng.random() < 0.7 else rng.choice(held)
            return rng.choice(
                [
                    outcome(CallCompleted, r, when, result_json=f'{{"n":{rng.randint(0, 9)}}}'),
                    outcome(
                        CallFailed, r, when, error="declined", not_attempted=rng.random() < 0.3
                    ),
                    outcome(CallIndeterminate, r, when, error="timeout after the request left"),
                ]
            )
        if kind == "abandon":
            rid = held[-1].reservation_id if held and rng.random() < 0.5 else uuid.uuid4()
            if not held or rid != held[-1].reservation_id:
                self.tombstoned.setdefault(key, []).append(rid)
            return event(CallAbandoned, run_id, tc, when, reservation_id=rid, **by)
        if kind == "reconcile" and call is not None:
            found = {"source": "reconcile", "expected_version": version}
            rid = call.reservation_id
            return rng.choice(
                [
                    event(CallCompleted, run_id, tc, when, reservation_id=rid, **found, **by),
                    event(
                        CallFailed,
                        run_id,
                        tc,
                        when,
                        reservation_id=rid,
                        error="no credit",
                        **found,
                        **by,
                    ),
                    event(
                        ReconcileAttempted,
                        run_id,
                        tc,
                        when,
                        reservation_id=rid,
                        expected_version=version,
                        attempt=1,
                        **by,
                    ),
                ]
            )
        if kind == "operator" and call is not None:
            who = {"operator": "ops@acme", "reason": "checked", "expected_version": version, **by}
            decision: OperatorEvent = rng.choice(
                [
                    event(
                        CallResolved,
                        run_id,
                        tc,
                        when,
                        outcome=rng.choice(["completed", "failed"]),
                        value_json='{"ok":true}',
                        result_reference="inv-7",
                        **who,
                    ),
                    event(CallApproved, run_id, tc, when, **who),
                    event(CallRejected, run_id, tc, when, **who),
                    event(CompensationRequested, run_id, tc, when, **who),
                ]
            )
            roll = rng.random()
            return decision if roll < 0.05 else signed(decision, valid=roll > 0.1)
        if kind == "compensation" and call is not None:
            comp = {"compensation_key": f"{key}:compensate", **by}
            return rng.choice(
                [
                    event(CallCompensated, run_id, tc, when, **comp),
                    event(CompensationFailed, run_id, tc, when, error="refund refused", **comp),
                ]
            )
        if kind == "run":
            expected = (run.version or 0) if run is not None else 0
            expected += rng.random() < 0.15
            fenced = {"expected_version": expected, **by}
            picked = tuple(c for c in self.CALLS if rng.random() < 0.6)
            return rng.choice(
                [
                    event(RunStarted, run_id, None, when, agent="penny", **by),
                    event(
                        RunCheckpointed,
                        run_id,
                        None,
                        when,
                        tool_call_ids=picked,
                        state_json=f'{{"turn":{expected}}}',
                        **fenced,
                    ),
                    event(RunCheckpointed, run_id, None, when, tool_call_ids=picked, **fenced),
                    event(
                        RunPaused,
                        run_id,
                        None,
                        when,
                        reason="awaiting_approval",
                        waiting_on=key,
                        **fenced,
                    ),
                    event(RunResumed, run_id, None, when, **fenced),
                    event(
                        RunResumeFailed,
                        run_id,
                        None,
                        when,
                        waiting_on=key,
                        attempts=5,
                        error="RuntimeError('no model')",
                        **by,
                    ),
                    event(RunFinished, run_id, None, when, outcome="completed", **fenced)
                    if rng.random() < 0.2
                    else event(RunResumed, run_id, None, when, **fenced),
                ]
            )
        run_version = None
        if run is not None and run.version is not None:
            run_version = run.version if rng.random() < 0.85 else rng.randint(0, 3)
        tombs = self.tombstoned.get(key)
        r = reserve(
            run_id,
            tc,
            when,
            producer=rng.choice([A, B]),
            tenant_id=tenant if rng.random() > 0.03 else "intruder",
            arguments=ARGS if rng.random() > 0.08 else {"amount_cents": 1},
            run_version=run_version,
            requires_approval=rng.random() < 0.15,
            reservation_id=tombs.pop() if tombs and rng.random() < 0.5 else None,
            deadline=timedelta(seconds=rng.randint(1, 20)),
        )
        self.reservations.setdefault(key, []).append(r)
        return r


class TestLedgerStoreContract:
    """What every LedgerStore promises. Subclasses provide `store`: started and empty."""

    @pytest.fixture
    def store(self) -> LedgerStore:
        raise NotImplementedError("each adapter's test class provides a started, empty store")

    @pytest.fixture
    async def ledger(self, store: LedgerStore) -> LedgerStore:
        await store.bind_log(IDENTITY)
        return store

    async def test_start_is_idempotent(self, store: LedgerStore) -> None:
        """Starting a ledger whose migrations are applied must neither fail nor touch data."""
        await store.bind_log(IDENTITY)
        log = Log()
        await log.feed(store, 0, reserve("r1", "c1", at(0)))
        await store.start()
        await store.start()
        await assert_same_ledger(store, log.reference)

    async def test_bind_log_records_identity_then_accepts_it_again(
        self, store: LedgerStore
    ) -> None:
        expected = {p: PartitionState(p, 1, IDENTITY.epoch, 2) for p in (0, 1)}
        assert await store.partition_state(0) is None
        assert await store.bind_log(IDENTITY) == expected
        assert await store.bind_log(IDENTITY) == expected
        assert await store.partition_state(1) == expected[1]
        assert await store.partition_state(2) is None

    async def test_bind_log_refuses_a_recreated_topic(self, ledger: LedgerStore) -> None:
        """A topic recreated with a new epoch must not be folded into the old ledger."""
        other = LogIdentity(IDENTITY.topic, uuid.uuid4(), IDENTITY.partitions)
        with pytest.raises(LogIdentityError, match="epoch") as err:
            await ledger.bind_log(other)
        assert str(other.epoch) in str(err.value)
        assert str(IDENTITY.epoch) in str(err.value)

    async def test_bind_log_refuses_a_changed_partition_count(self, ledger: LedgerStore) -> None:
        """With more partitions a run's events hash elsewhere; the projector must stop."""
        other = LogIdentity(IDENTITY.topic, IDENTITY.epoch, 3)
        with pytest.raises(LogIdentityError, match="3 partitions"):
            await ledger.bind_log(other)
        assert await ledger.partition_state(2) is None

    async def test_reservation_then_completion(self, ledger: LedgerStore) -> None:
        log = Log()
        r = reserve("r1", "c1", at(0))
        rival = reserve("r1", "c1", at(0.5), producer=B)
        done = completed(r, at(1))
        verdicts = await log.feed(ledger, 0, r, rival, done)
        assert [(v.accepted, v.reason) for v in verdicts] == [
            (True, "accepted"),
            (False, "held"),
            (True, "accepted"),
        ]
        call = await ledger.get_call("r1:c1")
        assert call is not None
        assert (call.status, call.version, call.reservation_id) == (
            "completed",
            2,
            r.reservation_id,
        )
        assert (call.result_json, call.settled_by) == ('{"credit":"cr-1"}', "runtime")
        assert (call.created_at, call.updated_at, call.deadline) == (at(0), at(1), at(30))
        history = await ledger.history("r1:c1")
        assert [(h.offset, h.event_type, h.reason, h.version) for h in history] == [
            (1, "call_reserved", "accepted", 1),
            (2, "call_reserved", "held", 1),
            (3, "call_completed", "accepted", 2),
        ]
        assert history[1].actor == "runtime:runtime-b/22"
        assert history[1].event_json == rival.history_json()
        found = await ledger.verdicts([rival.event_id, done.event_id, uuid.uuid4()])
        assert found == {rival.event_id: verdicts[1], done.event_id: verdicts[2]}
        run = await ledger.get_run("r1")
        assert run is not None
        assert run.tenant_id == "acme"
        assert await ledger.partition_state(0) == PartitionState(0, 4, IDENTITY.epoch, 2)
        assert await ledger.get_call("r1:c2") is None
        assert await ledger.history("r1:c2") == []
        await assert_same_ledger(ledger, log.reference)

    async def test_stale_start_offset_writes_nothing(self, ledger: LedgerStore) -> None:
        """A zombie projector replaying offsets another one applied must change nothing."""
        log = Log()
        r = reserve("r1", "c1", at(0))
        await log.feed(ledger, 0, r)
        before = await ledger.digest()
        late = Batch(0, 1, 3, [Positioned(0, 1, r), Positioned(0, 2, completed(r, at(1)))])
        with pytest.raises(OffsetConflict) as err:
            await ledger.apply_batch(late.partition, late.start, late.next, late.items)
        assert (err.value.expected, err.value.actual) == (1, 2)
        assert await ledger.digest() == before
        assert await ledger.partition_state(0) == PartitionState(0, 2, IDENTITY.epoch, 2)
        assert len(await ledger.history("r1:c1")) == 1
        assert await ledger.verdicts([late.items[1].event.event_id]) == {}  # type: ignore[union-attr]
        call = await ledger.get_call("r1:c1")
        assert call is not None
        assert call.status == "started"
        with pytest.raises(OffsetConflict) as unbound:
            await ledger.apply_batch(7, 1, 2, [Positioned(7, 1, completed(r, at(1)))])
        assert unbound.value.actual is None
        await assert_same_ledger(ledger, log.reference)

    async def test_two_projectors_racing_for_a_partition_apply_once(
        self, ledger: LedgerStore
    ) -> None:
        """Of two batches from the same start offset exactly one commits; the other is fenced."""
        r1, r2 = reserve("r1", "c1", at(0)), reserve("r1", "c1", at(0), producer=B)
        results = await asyncio.gather(
            ledger.apply_batch(0, 1, 2, [Positioned(0, 1, r1)]),
            ledger.apply_batch(0, 1, 2, [Positioned(0, 1, r2)]),
            return_exceptions=True,
        )
        assert sorted(type(x).__name__ for x in results) == ["OffsetConflict", "list"]
        assert len(await ledger.history("r1:c1")) == 1
        assert await ledger.partition_state(0) == PartitionState(0, 2, IDENTITY.epoch, 2)

    async def test_a_resent_event_id_is_applied_once(self, ledger: LedgerStore) -> None:
        """A producer retry reuses the event_id; a second verdict would double-count it."""
        log = Log()
        r = reserve("r1", "c1", at(0))
        done = completed(r, at(1))
        await log.feed(ledger, 0, r)
        verdicts = await log.feed(ledger, 0, r, done, done, r)
        assert [v.event_id for v in verdicts] == [done.event_id]
        history = await ledger.history("r1:c1")
        assert [h.offset for h in history] == [1, 3]
        assert await ledger.partition_state(0) == PartitionState(0, 6, IDENTITY.epoch, 2)
        assert await log.feed(ledger, 0, done) == []
        await assert_same_ledger(ledger, log.reference)

    async def test_a_dead_letter_quarantines_its_run(self, ledger: LedgerStore) -> None:
        """A run with an unreadable record must not be folded as if the record never existed."""
        log = Log()
        r = reserve("r1", "c1", at(0))
        other = reserve("r2", "c1", at(0))
        await log.feed(ledger, 1, r, ("r1", b"\xc3\x01\xff"), (None, b"junk"), ("r9", b"x"))
        verdicts = await log.feed(ledger, 1, completed(r, at(1)), other)
        assert [(v.accepted, v.reason) for v in verdicts] == [
            (False, "quarantined"),
            (True, "accepted"),
        ]
        run = await ledger.get_run("r1")
        assert run is not None
        assert (run.quarantined, run.quarantine_reason, run.tenant_id) == (
            True,
            "undecodable",
            "acme",
        )
        unknown = await ledger.get_run("r9")
        assert unknown is not None
        assert (unknown.quarantined, unknown.tenant_id) == (True, None)
        assert [(d.offset, d.run_id, d.payload) for d in await ledger.dead_letters()] == [
            (2, "r1", b"\xc3\x01\xff"),
            (3, None, b"junk"),
            (4, "r9", b"x"),
        ]
        call = await ledger.get_call("r1:c1")
        assert call is not None
        assert call.status == "started"
        await assert_same_ledger(ledger, log.reference)

    async def test_every_field_round_trips(self, ledger: LedgerStore) -> None:
        """Every column, optional values and microsecond UTC timestamps read back exactly."""
        log = Log()
        start = event(RunStarted, "r1", None, at(0), agent="penny")
        checkpoint = event(
            RunCheckpointed,
            "r1",
            None,
            at(0.000001),
            expected_version=0,
            tool_call_ids=("c1", "c2"),
            state_json='{"messages":["héllo"]}',
        )
        first = reserve("r1", "c1", at(1), run_version=1, requires_approval=True)
        ana = {"producer": B, "operator": "ana@acme"}
        approve = signed(
            event(CallApproved, "r1", "c1", at(2), reason="looks right", expected_version=1, **ana)
        )
        second = reserve("r1", "c1", at(3), run_version=1, requires_approval=True)
        lost = outcome(CallIndeterminate, second, at(4), error="read timeout")
        tried = outcome(ReconcileAttempted, second, at(5), expected_version=4, attempt=1)
        resolve = signed(
            event(
                CallResolved,
                "r1",
                "c1",
                at(40.123457),
                reason="credit cr-9 exists",
                expected_version=5,
                outcome="completed",
                value_json='{"credit":"cr-9"}',
                result_reference="s3://credits/cr-9",
                **ana,
            )
        )
        pause = event(
            RunPaused,
            "r1",
            None,
            at(41),
            expected_version=1,
            reason="awaiting_reconciliation",
            waiting_on="r1:c2",
        )
        tomb = event(CallAbandoned, "r1", "c2", at(42), reservation_id=uuid.uuid4())
        hook_failed = event(
            RunResumeFailed, "r1", None, at(43), waiting_on="r1:c2", attempts=3, error="boom"
        )
        events = [
            *(start, checkpoint, first, approve, second, lost, tried, resolve, pause, tomb),
            hook_failed,
        ]
        verdicts = await log.feed(ledger, 0, *events)
        assert all(v.accepted for v in verdicts), [v.detail for v in verdicts]
        call = await ledger.get_call("r1:c1")
        assert call is not None
        assert call == log.reference.calls["r1:c1"]
        assert (call.status, call.settled_by, call.operator, call.reason) == (
            "completed",
            "operator",
            "ana@acme",
            "credit cr-9 exists",
        )
        assert (call.result_json, call.result_reference, call.error) == (
            '{"credit":"cr-9"}',
            "s3://credits/cr-9",
            "read timeout",
        )
        assert (call.reconcile_attempts, call.requires_approval, call.version) == (1, True, 6)
        assert call.updated_at == at(40.123457)
        assert call.updated_at.utcoffset() == timedelta(0)
        run = await ledger.get_run("r1")
        assert run is not None
        assert run == log.reference.runs["r1"]
        assert run.checkpoint_calls == ("c1", "c2")
        assert run.abandoned == (str(tomb.reservation_id),)
        assert (run.status, run.waiting_on, run.updated_at) == (
            "awaiting_reconciliation",
            "r1:c2",
            at(43),
        )
        assert run.resume_error is not None and "3 times" in run.resume_error
        assert [h.event_type for h in await ledger.history("r1")] == [
            "run_started",
            "run_checkpointed",
            "run_paused",
            "run_resume_failed",
        ]
        await assert_same_ledger(ledger, log.reference)

    async def test_a_contested_call_is_stored_listed_and_cleared(self, ledger: LedgerStore) -> None:
        """A late completed that contradicts an operator's failed must survive in the store as
        the contested flag (or the call could be rerun after a restart), be listed, and be
        cleared only by a new resolve."""
        log = Log()
        r = reserve("r1", "c1", at(0), deadline=timedelta(seconds=10))
        who = {"operator": "ops@acme", "reason": "nothing in billing", "outcome": "failed"}
        decided = signed(event(CallResolved, "r1", "c1", at(60), expected_version=2, **who))
        late = completed(r, at(61))
        await log.feed(ledger, 0, r, outcome(CallIndeterminate, r, at(1), error="timeout"))
        verdicts = await log.feed(ledger, 0, decided, late)
        assert [(v.accepted, v.reason) for v in verdicts] == [
            (True, "accepted"),
            (False, "late_outcome"),
        ]
        call = await ledger.get_call("r1:c1")
        assert call is not None and call == log.reference.calls["r1:c1"]
        assert (call.status, call.contested, call.version) == ("failed", True, 4)
        assert call.contested_evidence is not None and str(late.event_id) in call.contested_evidence
        listed = await ledger.list_calls(CallQuery(tenant_id="acme", contested=True))
        assert [c.key for c in listed] == ["r1:c1"]
        rerun = await log.feed(ledger, 0, reserve("r1", "c1", at(62)))
        assert rerun[0].reason == "contested"
        again = {**who, "outcome": "completed", "reason": "found cr-1 after all"}
        await log.feed(
            ledger, 0, signed(event(CallResolved, "r1", "c1", at(63), expected_version=4, **again))
        )
        cleared = await ledger.get_call("r1:c1")
        assert cleared is not None and (cleared.status, cleared.contested) == ("completed", False)
        assert await ledger.list_calls(CallQuery(tenant_id="acme", contested=True)) == []
        await assert_same_ledger(ledger, log.reference)

    async def test_blobs_are_content_addressed_and_read_back_byte_for_byte(
        self, ledger: LedgerStore
    ) -> None:
        """A payload stored by reference must read back exactly, a resend must change nothing,
        and an unknown digest must be absent rather than an error or an empty payload."""
        data = ('"' + "é" * 50_000 + '"').encode()
        digest = digest_of(data)
        await ledger.put_blobs({digest: data})
        await ledger.put_blobs({digest: data})
        assert await ledger.get_blobs([digest, "0" * 64]) == {digest: data}
        assert await ledger.get_blobs([]) == {}

    async def test_digest_equals_the_reference_fold(self, ledger: LedgerStore) -> None:
        """Replaying the log into an empty ledger must give the same digest as the fold."""
        log = Log()
        assert await ledger.digest() == log.reference.digest()
        r = reserve("r1", "c1", at(0))
        await log.feed(ledger, 0, r, completed(r, at(2)))
        await log.feed(ledger, 1, reserve("r2", "c1", at(1)), ("r2", b"?"))
        assert await ledger.digest() == log.reference.digest()

    async def test_facts_since_gives_each_verdict_at_its_position(
        self, ledger: LedgerStore
    ) -> None:
        """A new owner republishes facts from the store: each verdict with the event it decided,
        at the offset where it was decided (a resend later in the log is not a new fact)."""
        log = Log()
        r = reserve("r1", "c1", at(0))
        rival = reserve("r1", "c1", at(0), producer=B)
        await log.feed(ledger, 0, r, rival, ("r2", b"?"), r, completed(r, at(1)))
        published = [
            Fact(
                partition=0,
                offset=h.offset,
                verdict=log.reference.verdicts[h.event_id],
                event_json=h.event_json,
            )
            for h in log.reference.history
        ]
        assert [f.offset for f in published] == [1, 2, 5]
        assert await ledger.facts_since(0, 0, 100) == published
        assert await ledger.facts_since(0, 2, 1) == published[1:2]
        assert await ledger.facts_since(0, 3, 100) == published[2:]
        assert await ledger.facts_since(1, 0, 100) == []

    async def test_the_facts_mark_only_moves_forward(self, ledger: LedgerStore) -> None:
        """Two owners marking out of order must not make the newer one republish less."""
        assert await ledger.facts_published(0) == 0
        await ledger.mark_facts_published(0, 7)
        await ledger.mark_facts_published(0, 3)
        assert await ledger.facts_published(0) == 7
        await ledger.mark_facts_published(0, 9)
        assert (await ledger.facts_published(0), await ledger.facts_published(1)) == (9, 0)

    async def test_a_batch_out_of_log_order_is_refused(self, ledger: LedgerStore) -> None:
        r = reserve("r1", "c1", at(0))
        with pytest.raises(ValueError, match="log order"):
            await ledger.apply_batch(0, 1, 3, [Positioned(0, 2, r), Positioned(0, 1, r)])
        with pytest.raises(ValueError, match="log order"):
            await ledger.apply_batch(0, 1, 2, [Positioned(1, 1, r)])
        assert await ledger.partition_state(0) == PartitionState(0, 1, IDENTITY.epoch, 2)

    @pytest.mark.parametrize(
        ("seed", "count", "sizes"),
        [
            (1, 400, (1, 40)),
            (2, 400, (1, 40)),
            (3, 400, (1, 40)),
            (4, 400, (1, 40)),
            (5, 2400, (300, 900)),
        ],
    )
    async def test_mixed_log_matches_the_reference_fold(
        self, ledger: LedgerStore, seed: int, count: int, sizes: tuple[int, int]
    ) -> None:
        """PostgreSQL, memory and the pure fold must agree on every row of a messy log."""
        mixed = MixedLog(seed, count)
        reference = mixed.log.reference
        pending = {p: mixed.batches(p, sizes) for p in (0, 1)}
        expected = {p: _decided_once(b.items for b in pending[p]) for p in (0, 1)}
        got: dict[int, list[uuid.UUID]] = {0: [], 1: []}
        while pending[0] or pending[1]:
            b = pending[mixed.rng.choice([p for p in (0, 1) if pending[p]])].pop(0)
            verdicts = await ledger.apply_batch(b.partition, b.start, b.next, b.items)
            assert verdicts == [reference.verdicts[v.event_id] for v in verdicts]
            got[b.partition] += [v.event_id for v in verdicts]
        assert got == expected
        reasons = Counter(v.reason for v in reference.verdicts.values())
        assert {"accepted", "held", "late_outcome", "quarantined"} <= set(reasons), reasons
        assert len(reasons) >= 12, reasons
        await assert_same_ledger(ledger, reference)

    @pytest.mark.parametrize(("seed", "count", "sizes"), [(6, 300, (1, 40)), (7, 1600, (300, 900))])
    async def test_a_batchs_facts_are_its_verdicts_and_history_as_written(
        self, ledger: LedgerStore, seed: int, count: int, sizes: tuple[int, int]
    ) -> None:
        """Facts are pasted from what the store wrote, not re-serialised: each pasted fact must
        read back as the fact the old code built (the verdict, its event's position and JSON),
        in small batches (one statement) and large ones (COPY while folding)."""
        mixed = MixedLog(seed, count)
        reference = mixed.log.reference
        for partition in (0, 1):
            for batch in mixed.batches(partition, sizes):
                applied = await ledger.apply_written(
                    batch.partition, batch.start, batch.next, batch.items
                )
                want = [reference.verdicts[v.event_id] for v in applied.verdicts]
                assert applied.verdicts == want
                assert [h.event_id for h in applied.history] == [
                    v.event_id for v in applied.verdicts
                ]
                texts = facts_of(applied.history, applied.verdicts, applied.verdict_json())
                got = [f for text in texts for f in facts_in(f"[{text.json}]".encode())]
                by_id = {e.event_id: e for e in reference.history if e.partition == partition}
                assert got == [
                    Fact(
                        partition=partition,
                        offset=by_id[v.event_id].offset,
                        verdict=v,
                        event_json=by_id[v.event_id].event_json,
                    )
                    for v in applied.verdicts
                ]
                assert [t.run_id for t in texts] == [v.run_id for v in applied.verdicts]

    @pytest.mark.parametrize(("seed", "count", "sizes"), [(8, 400, (1, 40)), (9, 1600, (60, 300))])
    async def test_batches_a_leader_folded_write_the_reference_ledger(
        self, ledger: LedgerStore, seed: int, count: int, sizes: tuple[int, int]
    ) -> None:
        """A batch written from a leader's fold (`apply_folded`: its verdicts and rows, decided
        once, without history) must leave exactly the rows, history chains, verdicts and dead
        letters that folding it in the store does, mixed in any order with batches the store
        folds itself: a history entry chained to the wrong head, or a row the leader changed
        left as it was, would differ from the reference."""
        mixed = MixedLog(seed, count)
        reference = mixed.log.reference
        leader = LedgerFold(keys=KEYS, with_history=False)
        pending = {p: mixed.batches(p, sizes) for p in (0, 1)}
        ways: Counter[str] = Counter()
        while pending[0] or pending[1]:
            b = pending[mixed.rng.choice([p for p in (0, 1) if pending[p]])].pop(0)
            folded = [leader.folded(item) for item in b.items]
            if mixed.rng.random() < 0.7:
                ways["folded"] += 1
                applied = await ledger.apply_folded(b.partition, b.start, b.next, folded)
            else:
                ways["written"] += 1
                applied = await ledger.apply_written(b.partition, b.start, b.next, b.items)
            assert applied.verdicts == [reference.verdicts[v.event_id] for v in applied.verdicts]
            assert applied.verdicts == [f.verdict for f in folded if f.verdict is not None]
        assert ways["folded"] and ways["written"]
        await assert_same_ledger(ledger, reference)

    async def test_a_batch_that_fails_midway_writes_nothing(
        self, ledger: LedgerStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fold that breaks after rows were already sent must roll them back, offset included."""
        log = Log()
        events: list[Event] = []
        for n in range(300):
            r = reserve(f"r{n}", "c1", at(n))
            events += [r, completed(r, at(n + 0.5))]
        batch = log.batch(0, *events)
        fold_apply = LedgerFold.apply
        calls = 0

        def breaks_late(fold: LedgerFold, item: Positioned | DeadLetter) -> Verdict | None:
            nonlocal calls
            calls += 1
            if calls == 550:
                raise RuntimeError("fold broke")
            return fold_apply(fold, item)

        monkeypatch.setattr(LedgerFold, "apply", breaks_late)
        with pytest.raises(RuntimeError, match="fold broke"):
            await ledger.apply_batch(batch.partition, batch.start, batch.next, batch.items)
        monkeypatch.undo()
        assert await ledger.partition_state(0) == PartitionState(0, 1, IDENTITY.epoch, 2)
        assert await ledger.history("r0:c1") == []
        assert await ledger.verdicts([events[0].event_id]) == {}
        assert await ledger.digest() == LedgerFold(keys=KEYS).digest()
        got = await ledger.apply_batch(batch.partition, batch.start, batch.next, batch.items)
        assert got == log.fold(batch)
        await assert_same_ledger(ledger, log.reference)


def _decided_once(batches: Iterable[Sequence[Positioned | DeadLetter]]) -> list[uuid.UUID]:
    """The event_ids a fold decides, in log order: each one's first appearance."""
    seen: dict[uuid.UUID, None] = {}
    for items in batches:
        for item in items:
            if isinstance(item, Positioned):
                seen.setdefault(item.event.event_id)
    return list(seen)


class TestMemoryLedger(TestLedgerStoreContract):
    @pytest.fixture
    async def store(self) -> MemoryLedger:
        ledger = MemoryLedger(verify_keys=KEYS)
        await ledger.start()
        return ledger

    async def test_subscribers_hear_of_each_new_verdict_once(self, store: MemoryLedger) -> None:
        """The in-memory LISTEN: a waiter must hear of its verdict, and only while subscribed."""
        await store.bind_log(IDENTITY)
        log = Log()
        r = reserve("r1", "c1", at(0))
        done = completed(r, at(1))
        with store.subscribe() as queue:
            await log.feed(store, 0, r, r, done)
            heard = [queue.get_nowait() for _ in range(queue.qsize())]
        assert heard == [r.event_id, done.event_id]
        await log.feed(store, 0, reserve("r1", "c2", at(2)))
        assert queue.empty()


@pytest.mark.services
class TestPostgresLedger(TestLedgerStoreContract):
    @pytest.fixture
    async def store(self, pg_dsn: str, pg_schema: str) -> AsyncIterator[PostgresLedger]:
        ledger = PostgresLedger(pg_dsn, pg_schema, verify_keys=KEYS)
        await ledger.start()
        try:
            yield ledger
        finally:
            await ledger.close()

    async def test_concurrent_starts_apply_each_migration_once(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """Two processes starting on a fresh schema must not both run the DDL."""
        settings = {"search_path": pg_schema}
        conns = [await asyncpg.connect(pg_dsn, server_settings=settings) for _ in range(3)]
        try:
            applied = await asyncio.gather(*(migrate(c, pg_schema) for c in conns))
            versions = [m.version for m in load_migrations()]
            assert sorted(applied) == [[], [], versions]
            rows = await conns[0].fetch("SELECT version FROM schema_migrations ORDER BY version")
            assert [r["version"] for r in rows] == versions
        finally:
            for c in conns:
                await c.close()

    async def test_migration_4_chains_the_history_written_before_it(
        self, pg_dsn: str, pg_schema: str
    ) -> None:
        """A ledger upgraded to chained history must hold the chains the projector would have
        written, computed in SQL over the same bytes, or `replay --verify` fails after an
        upgrade."""
        first, second = b.reserved("m1", "c1"), b.reserved("m2", "c1")
        fold = LedgerFold(keys=b.KEYS)
        events = [first, second, b.completed(first), b.completed(first), b.completed(second)]
        for offset, event in enumerate(events, start=1):
            partition = 0 if event.run_id == "m1" else 1  # a run lives in one partition
            fold.apply(Positioned(partition=partition, offset=offset, event=event))
        columns = [c for c in HistoryEntry.model_fields if c != "chain_hash"]
        conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": pg_schema})
        try:
            before = [m for m in load_migrations() if m.version < 4]
            await migrate(conn, pg_schema, before)
            await conn.copy_records_to_table(
                "tool_execution_history",
                records=[tuple(getattr(h, c) for c in columns) for h in fold.history],
                columns=columns,
            )
            through_4 = [m for m in load_migrations() if m.version <= 4]
            assert await migrate(conn, pg_schema, through_4) == [4]
            rows = await conn.fetch(
                'SELECT chain_hash FROM tool_execution_history ORDER BY partition, "offset"'
            )
        finally:
            await conn.close()
        expected = sorted(fold.history, key=lambda h: (h.partition, h.offset))
        assert [r["chain_hash"] for r in rows] == [h.chain_hash for h in expected]
        assert len({h.chain_hash for h in expected}) == len(expected)

    async def test_a_stored_blob_cannot_be_changed_or_removed(
        self, store: PostgresLedger, pg_dsn: str, pg_schema: str
    ) -> None:
        """A blob is evidence like the history: rewriting it would change what a digest in the
        log stands for."""
        data = b'"evidence"'
        await store.put_blobs({digest_of(data): data})
        conn = await asyncpg.connect(pg_dsn, server_settings={"search_path": pg_schema})
        try:
            for statement in ("UPDATE payload_blobs SET data = 'x'", "DELETE FROM payload_blobs"):
                with pytest.raises(asyncpg.RaiseError, match="append-only"):
                    await conn.execute(statement)
        finally:
            await conn.close()

    async def test_verdicts_are_announced_on_commit(
        self, store: PostgresLedger, pg_dsn: str
    ) -> None:
        """Waiters LISTEN for verdicts: one must come for each, carrying the stored verdict
        after its event_id, only after commit."""
        heard: asyncio.Queue[str] = asyncio.Queue()

        def on_notify(
            _conn: asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record],
            _pid: int,
            _channel: str,
            payload: object,
        ) -> None:
            heard.put_nowait(str(payload))

        listener = await asyncpg.connect(pg_dsn)
        try:
            await listener.add_listener(store.notify_channel, on_notify)
            await store.bind_log(IDENTITY)
            r = reserve("r1", "c1", at(0))
            rival = reserve("r1", "c1", at(0), producer=B)
            await Log().feed(store, 0, r, rival, r)
            got = [(await asyncio.wait_for(heard.get(), 5)).split(" ", 1) for _ in range(2)]
            assert [head for head, _ in got] == [str(r.event_id), str(rival.event_id)]
            stored = await store.verdicts([r.event_id, rival.event_id])
            assert [Verdict.model_validate_json(body) for _, body in got] == [
                stored[r.event_id],
                stored[rival.event_id],
            ]
            with pytest.raises(OffsetConflict):
                await store.apply_batch(0, 1, 2, [Positioned(0, 1, completed(r, at(1)))])
            await asyncio.sleep(0.2)
            assert heard.empty()
        finally:
            await listener.close()

    def test_notify_channel_fits_a_postgres_name(self) -> None:
        assert PostgresLedger("postgresql://x", "toolledger").notify_channel == (
            "toolledger_v_toolledger"
        )
        long_a = PostgresLedger("postgresql://x", "a" * 60).notify_channel
        long_b = PostgresLedger("postgresql://x", "a" * 59 + "b").notify_channel
        assert len(long_a) <= 63
        assert long_a != long_b


del TestLedgerStoreContract
