"""The projector: the single writer that folds `toolledger.events` into the ledger.

One loop per process. Every ownership round it takes the partitions whose advisory lock it can
get, checks the log identity (epoch marker at offset 0, partition count) against what the ledger
recorded, and seeks each to the next offset stored in PostgreSQL. Every fetch is applied per
partition in one `apply_batch` transaction (records, history, verdicts, next offset by
compare-and-set). If the compare-and-set misses, another process owns the partition now: the
batch rolled back and the projector lets the partition go. Before writing it confirms its lease
on the partition (`PartitionLocks.confirmed`, free while the lease is fresh), so a process that
stalled past its lease stands down without writing; the compare-and-set stays the fence.

Unreadable records: an unknown schema fingerprint halts the partition (a newer writer is ahead
of this reader; folding around it would skip an event of some run). So does an operator event
signed with a key id this projector has no public key for ("deploy keys before signers"):
rejecting it would make the verdict depend on which keys this process happened to have. Bytes
that cannot be decoded at all are dead letters: published to the DLQ topic with the reason in
the headers, recorded in `dead_letters`, and their run is quarantined, all in the same
transaction as the offset move.

Each batch's transaction is a span, and a reservation carrying a trace context gets one in the
call's trace (`toolledger.projections.tracing`).

While nothing arrives its reader backs off to the idle bound between fetches, and `wake` (an
append hint, `toolledger.projections.hints`) ends the wait at once; so an idle projector's loop
turns a few times a second, and its ownership checks with it.

A partition its leader carries (`PartitionFollower.carries`) is not fetched: the leader hands
over what it appended and proved, with its fold's verdicts and rows (`PartitionFollower.proven`),
and the projector writes those (`LedgerStore.apply_folded`) without fetching or folding them
again. The reader parks such a partition and fetches only what no batch of this process
covers, up to an offset a hint or an end-offset check says is there
(`toolledger.projections.carried`); what it fetches the leader folds before the commit
(`PartitionFollower.folding`), once. Fetching back what this process appended cost the local
broker ten times the appends' CPU (BENCHMARKS.md, issue 46).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from toolledger.errors import ConfigError
from toolledger.events.codec import decode
from toolledger.events.fold import DeadLetter, Folded, Positioned
from toolledger.events.log import (
    EventLog,
    LogError,
    LogIdentity,
    LogIdentityError,
    LogReader,
    LogRecord,
    TopicMissing,
)
from toolledger.events.models import Event
from toolledger.events.pacing import BOUND_S
from toolledger.events.records import Verdict
from toolledger.projections.carried import CarriedReads
from toolledger.projections.dberrors import database_errors
from toolledger.projections.decoding import decode_entries
from toolledger.projections.facts import FactsPublisher, FactText, fact_text, facts_of
from toolledger.projections.following import PartitionFollower, Proven
from toolledger.projections.gc_pause import gc_paused
from toolledger.projections.ownership import PartitionLocks
from toolledger.projections.store import AppliedBatch, LedgerStore, OffsetConflict
from toolledger.projections.tracing import BatchSpans

log = logging.getLogger("toolledger.projector")

VerdictSink = Callable[[int, Sequence[Verdict]], Awaitable[None]]

#: A projection batch's entries: records fetched, or handed over proven and folded.
Entry = LogRecord | Proven


def _gone(exc: TopicMissing) -> LogIdentityError:
    return LogIdentityError(
        f"{exc}: the events topic the ledger was built from is gone (the broker lost its "
        "data?); the ledger in PostgreSQL is intact; restore the topic, or start a new ledger "
        "schema and replay into it"
    )


@dataclass
class ProjectorStats:
    applied: int = 0
    batches: int = 0
    dead_letters: int = 0
    conflicts: int = 0
    #: Records taken from the follower rather than fetched (`PartitionFollower.proven`).
    handed: int = 0
    #: Records the reader fetched for owned partitions (some may have been handed over too).
    fetched: int = 0
    #: Records written as the follower folded them, and records folded by the store itself.
    written_folded: int = 0
    folded_here: int = 0
    halted: dict[int, str] = field(default_factory=dict)
    owned_since: dict[int, float] = field(default_factory=dict)


@dataclass
class _Held:
    """A partition's fetched records waiting to commit together (`Projector.linger`): from
    offset `start`, the partition's stored next offset, until `due` (monotonic seconds)."""

    start: int
    due: float
    records: list[Entry] = field(default_factory=list)


class Projector:
    """Folds owned partitions of the events topic into a `LedgerStore`."""

    def __init__(
        self,
        log: EventLog,
        store: LedgerStore,
        locks: PartitionLocks,
        *,
        dlq: EventLog | None = None,
        facts: FactsPublisher | None = None,
        on_verdicts: VerdictSink | None = None,
        batch_size: int = 2000,
        fetch_wait_ms: int = 5,
        ownership_interval: float = 0.25,
        identity_interval: float = 2.0,
        broker_retry: float = 1.0,
        decode: Callable[[bytes], Event] = decode,
        facts_in_background: bool = True,
        follower: PartitionFollower | None = None,
        linger_ms: int = 0,
        end_check_ms: int = int(BOUND_S * 1000),
    ) -> None:
        self.log = log
        self.store = store
        self.locks = locks
        self.dlq = dlq
        self.facts = facts
        self.on_verdicts = on_verdicts
        self.batch_size = batch_size
        self.fetch_wait = fetch_wait_ms / 1000
        self.ownership_interval = ownership_interval
        self.identity_interval = identity_interval
        self.broker_retry = broker_retry
        self._identity_failure: LogIdentityError | None = None
        self.decode = decode
        self.facts_in_background = facts_in_background
        #: Hears of ownership and commits (the leader fast path, `toolledger.leader`).
        self.follower = follower
        #: Seconds a partition's handed records wait for more before they commit, while its
        #: follower answered them (`Proven.own`, `PartitionFollower.carries`); 0: never.
        self.linger = linger_ms / 1000
        self._held: dict[int, _Held] = {}
        self.stats = ProjectorStats()
        self._resync: set[int] = set()
        self._owned: dict[int, int] = {}
        self._identity: LogIdentity | None = None
        self._reader: LogReader | None = None
        self._stopping = asyncio.Event()
        self._next_ownership = 0.0
        self._facts_in_flight: asyncio.Task[None] | None = None
        #: What the reader leaves to the follower (None: no follower), checked every
        #: `end_check_ms` (the readers' idle bound: the most an unhinted record waits).
        self.carried = (
            None if follower is None else CarriedReads(follower, max(end_check_ms, 50) / 1000)
        )
        #: Set when the follower has records to hand over, or a hint came.
        self._nudge = asyncio.Event()
        if follower is not None:
            follower.attach(self._handed)

    @property
    def owned(self) -> dict[int, int]:
        """Partitions this process projects now, with their next offsets."""
        return dict(self._owned)

    @property
    def held(self) -> dict[int, int]:
        """Partitions whose fetched records wait to commit together, with how many wait."""
        return {p: len(h.records) for p, h in self._held.items()}

    @property
    def parked(self) -> frozenset[int]:
        """Partitions the reader does not fetch now: the follower hands their records over."""
        return frozenset() if self.carried is None else self.carried.parked

    def stop(self) -> None:
        self._stopping.set()
        self._nudge.set()
        if self._reader is not None:
            self._reader.wake()  # a reader backed off while idle would finish its wait first

    def wake(self, partitions: Mapping[int, int | None] | None = None) -> bool:
        """A hint that records were appended to `partitions`, each before the offset given
        (None: unknown), or maybe to any (None): if this projector owns one, its reader fetches
        at once, even when backed off while idle, and a parked one as far as the hint says
        (`toolledger.projections.hints`). Says whether it owns one."""
        owned = self._owned
        if partitions is None:
            partitions = dict.fromkeys(owned)
        owns = any(p in owned for p in partitions)
        if owns and self.carried is not None and self.carried.hinted(partitions):
            self._nudge.set()
        if owns and self._reader is not None:
            self._reader.wake()
        return owns

    def _handed(self, partition: int) -> None:
        """The follower has records of `partition` to hand over (`PartitionFollower.attach`)."""
        if partition in self._owned:
            self._nudge.set()
            if self._reader is not None:
                self._reader.wake()  # a fetch backed off for other partitions ends its wait

    async def run(self) -> None:
        """Project until `stop()`; raises `LogIdentityError` if the log is not the ledger's.

        Refuses to start (`ConfigError`) without public keys, and (`KeySetMismatch`) with keys
        that lack or contradict the ones this ledger's projectors registered before.
        """
        if not self.store.verify_keys:
            raise ConfigError(
                "TOOLLEDGER_VERIFY_KEYS must name at least one public key: a projector "
                "verifies operator decisions with them and cannot judge one without"
            )
        await self.store.register_verify_keys()
        identity = await self._answering_identity(retry_first=False)
        if identity is None:  # stopped before the broker ever answered
            return
        self._identity = identity
        await self.store.bind_log(identity)
        self._reader = self.log.reader()
        watch = asyncio.create_task(self._watch_identity(), name="toolledger-identity-watch")
        ends = None
        if self.carried is not None:
            ends = asyncio.create_task(self._watch_ends(self.carried), name="toolledger-ends")
        try:
            while not self._stopping.is_set():
                try:
                    await self.step()
                except database_errors() as exc:
                    await self._lost_database(exc)
                except LogIdentityError:
                    raise
                except TopicMissing as exc:
                    raise _gone(exc) from exc
                except LogError as exc:
                    await self._lost_broker(exc)
            if self._identity_failure is not None:
                raise self._identity_failure
            await self._commit_held_at_stop()
            await self._facts_sent()
        finally:
            for task in (watch, ends):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self._facts_in_flight is not None:  # stopped by an error: at least once covers it
                self._facts_in_flight.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._facts_sent()
            await self._reader.close()
            await self.locks.close()

    async def _commit_held_at_stop(self) -> None:
        """Commit what is held before stopping, if the services let it; if not, nothing is lost:
        the next owner folds those records from the stored offset to the same verdicts."""
        lost: tuple[type[BaseException], ...] = (LogError, *database_errors())
        try:
            await self._commit_held()
        except lost as exc:
            log.warning(
                "stopping with held records uncommitted (%s): the next owner folds them", exc
            )

    async def _answering_identity(self, *, retry_first: bool) -> LogIdentity | None:
        """The log's identity once the broker answers (None if stopped first), at start and
        after losing the broker (`_lost_broker`). A topic that is gone or holds another epoch
        raises `LogIdentityError`; a broker that does not answer is retried every
        `broker_retry` seconds (first waited for when `retry_first`)."""
        while not self._stopping.is_set():
            if retry_first:
                await asyncio.sleep(self.broker_retry)
            retry_first = True
            try:
                return await self.log.identity()
            except LogIdentityError:
                raise
            except TopicMissing as exc:
                raise _gone(exc) from exc
            except LogError as exc:
                log.warning("cannot read the log identity (%s); retrying", exc)
        return None

    async def _lost_database(self, exc: BaseException) -> None:
        """PostgreSQL went away mid-batch (a restart, a failover, a killed session).

        Whether the last batch committed is unknown, so every partition is re-read from the
        offsets the ledger holds once it answers again; the compare-and-set makes a batch that
        did commit impossible to apply twice. The projector keeps running rather than exiting:
        a database restart must not take every projector down with it.
        """
        log.warning("PostgreSQL error (%s); re-reading positions when it is back", exc)
        self._resync |= set(self._owned) | self.locks.held()
        self._released(self._resync)
        self._owned.clear()
        self._held.clear()
        self._next_ownership = 0.0
        await asyncio.sleep(0.5)

    async def _lost_broker(self, exc: LogError) -> None:
        """Kafka stopped answering (a broker restart, a network partition).

        The projector stands down as if it had restarted: facts in flight are dropped (their mark
        did not move, so they are republished), the partition locks are released so a projector
        that still reaches the broker can take over, and the reader is replaced. It then waits
        until the log answers with the identity the ledger was built from and takes partitions
        again, republishing facts from the published marks. A broker that came back without
        its data stops the projector with the log-identity error (here or in the watch).
        """
        log.warning("Kafka error (%s); standing down until the broker answers", exc)
        task, self._facts_in_flight = self._facts_in_flight, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._released(set(self._owned) | self._resync)
        self._owned.clear()
        self._held.clear()
        self._resync.clear()
        self._next_ownership = 0.0
        await self.locks.close()
        assert self._reader is not None
        with contextlib.suppress(LogError):
            await self._reader.close()
        self._reader = self.log.reader()
        identity = await self._answering_identity(retry_first=True)
        if identity is not None:
            await self.store.bind_log(identity)
            log.info("Kafka answers again; taking partitions")

    async def _watch_identity(self) -> None:
        """Re-read offset 0 every few seconds while running.

        A broker that lost its data (the local broker on restart; a misconfigured cluster)
        serves an empty or recreated topic, and a fetch past its end returns nothing instead
        of an error, so only the epoch marker tells. Runs beside the fetch loop so it adds no
        latency; a failure stops the projector and leaves PostgreSQL untouched.
        """
        while True:
            await asyncio.sleep(self.identity_interval)
            try:
                identity = await self.log.identity()
                await self.store.bind_log(identity)
            except (LogIdentityError, TopicMissing) as exc:
                self._identity_failure = exc if isinstance(exc, LogIdentityError) else _gone(exc)
                self._stopping.set()
                return
            except LogError as exc:
                log.warning("could not check the log identity (%s); will retry", exc)

    async def _watch_ends(self, carried: CarriedReads) -> None:
        """Check the end offsets of the parked partitions every `carried.check_every` seconds,
        and at once when a hint named no offset: a record nobody hinted, or whose hint was lost,
        is fetched within that bound (`toolledger.projections.carried`)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(carried.check_every):
                    await carried.check_now.wait()
            carried.check_now.clear()
            try:
                positions = {p: self._position(p) for p in self._owned}
                if await carried.check_ends(self.log, positions):
                    self._nudge.set()
            except LogError as exc:  # the projector's own fetches report a broker that is gone
                log.debug("could not check the end offsets (%s); will retry", exc)

    async def step(self) -> int:
        """One ownership check (when due) and one fetch-and-apply; returns events applied."""
        assert self._reader is not None and self._identity is not None
        if self._facts_in_flight is not None and self._facts_in_flight.done():
            await self._facts_sent()  # a publishing failure surfaces here, within a fetch wait
        now = time.monotonic()
        if now >= self._next_ownership:
            self._next_ownership = now + self.ownership_interval
            await self._rebalance()
        if not self._owned:
            await asyncio.sleep(min(self.ownership_interval, 0.05))
            return 0
        wait = self.fetch_wait
        due = min((h.due for h in self._held.values()), default=None)
        if due is not None:
            wait = max(0.0, min(wait, due - now))
        applied = 0
        if self.follower is not None:  # first: the reader then starts past what was handed
            applied += await self._take_handed()
        if self._park():
            batch = await self._nudged(due)
        else:
            batch = await self._fetch(wait, due)
        for partition, records in batch.items():
            if partition in self._owned:
                self.stats.fetched += len(records)
                applied += await self._take(partition, records)
        if self.follower is not None:
            applied += await self._take_handed()
        if self._held and min(h.due for h in self._held.values()) <= time.monotonic():
            # One round for every held partition once the first is due: fewer wakeups, and
            # a zombie's batches all meet the compare-and-set before its next lock check.
            applied += await self._commit_held()
        return applied

    def _park(self) -> bool:
        """Park the partitions the follower carries, but for those with records wanted or
        handed records that do not join up; say whether that is every partition read (the
        reader has nothing to fetch)."""
        carried = self.carried
        if carried is None:
            return False
        halted = self.stats.halted
        parked = carried.choose({p: self._position(p) for p in self._owned}, halted)
        if parked != carried.parked:
            assert self._reader is not None
            unparked = carried.parked - parked
            carried.parked = parked
            self._reader.park(parked)
            if unparked:  # a reader backed off while every partition was parked fetches now
                self._reader.wake()
        return bool(parked) and all(p in parked or p in halted for p in self._owned)

    async def _nudged(self, due: float | None) -> dict[int, list[LogRecord]]:
        """Every partition read is parked: wait for the follower, a hint, or the next thing
        due (held records, an ownership check), whichever comes first."""
        if not self._nudge.is_set():
            until = self._next_ownership if due is None else min(self._next_ownership, due)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(_loop_time(until)):
                    await self._nudge.wait()
        self._nudge.clear()
        return {}

    async def _fetch(self, wait: float, due: float | None) -> dict[int, list[LogRecord]]:
        """A fetch; one backed off while idle is woken when held records fall due (records
        the follower handed over are held while other partitions find nothing)."""
        assert self._reader is not None
        self._nudge.clear()
        if due is None or not self.parked:
            return await self._reader.fetch(max_wait=wait, max_records=self.batch_size)
        alarm = asyncio.get_running_loop().call_at(_loop_time(due), self._reader.wake)
        try:
            return await self._reader.fetch(max_wait=wait, max_records=self.batch_size)
        finally:
            alarm.cancel()

    async def _take_handed(self) -> int:
        """Take what the follower proved and folded since each partition's position, and move
        the reader past it."""
        assert self.follower is not None and self._reader is not None and self.carried
        unjoined = self.carried.unjoined
        applied = 0
        for partition in list(self._owned):
            if partition not in self._owned or partition in self.stats.halted:
                continue
            proven = self.follower.proven(partition, self._position(partition))
            if proven is None:
                unjoined.add(partition)
                continue
            unjoined.discard(partition)
            if proven:
                self.stats.handed += len(proven)
                self._reader.skip(partition, proven[-1].offset + 1)
                applied += await self._take(partition, proven)
        return applied

    def _position(self, partition: int) -> int:
        """The next offset `partition` needs: after its held records, else its stored one."""
        held = self._held.get(partition)
        if held is not None and held.records:
            return held.records[-1].offset + 1
        return self._owned[partition]

    async def _take(self, partition: int, records: Sequence[Entry]) -> int:
        """Apply fetched or handed records now, or hold them for the partition's next commit.

        Records the follower appended and answered from memory (`Proven.own`) have nobody
        waiting for their commit, so they may wait `linger` seconds for the records after them:
        in serial work a whole call then commits in one transaction, with one publication of
        facts, instead of one per record. Records someone else appended (a foreign writer, who
        awaits the committed verdict) commit at once, with whatever is held before them.
        """
        position = self._position(partition)
        if records[0].offset < position:  # fetched after the follower handed them over
            records = [r for r in records if r.offset >= position]
            if not records:
                return 0
        held = self._held.get(partition)
        lingers = self._lingers(partition, records)
        if held is None:
            if not lingers:
                return await self._apply(partition, list(records))
            held = _Held(self._owned[partition], time.monotonic() + self.linger)
            self._held[partition] = held
        held.records.extend(records)
        if not lingers or len(held.records) >= self.batch_size:
            return await self._commit_held((partition,))
        return 0

    def _lingers(self, partition: int, records: Sequence[Entry]) -> bool:
        follower = self.follower
        return (
            self.linger > 0
            and follower is not None
            and all(isinstance(r, Proven) and r.own for r in records)
            and follower.carries(partition)
        )

    async def _commit_held(self, partitions: Collection[int] | None = None) -> int:
        """Apply the held records of `partitions` (all if None). Records held from an offset
        the partition is no longer at (re-read, released) are dropped: the reader was sent back
        to the stored offset, and reads them again."""
        applied = 0
        for partition, held in list(self._held.items()):
            if partitions is not None and partition not in partitions:
                continue
            del self._held[partition]
            if self._owned.get(partition) == held.start and held.records:
                applied += await self._apply(partition, held.records)
        return applied

    async def _rebalance(self) -> None:
        """Drop partitions whose lock is gone, take free ones, re-seek those that need it."""
        assert self._reader is not None and self._identity is not None
        if not await self.locks.check():
            log.warning("lost the partition locks (PostgreSQL session ended); standing down")
        taken = await self.locks.acquire(range(self._identity.partitions))
        # After acquiring: with shared ownership, acquiring may release partitions above the
        # share, and those must not be applied once another process can take them.
        dropped = set(self._owned) - self.locks.held()
        for partition in dropped:
            self._owned.pop(partition)
            self._held.pop(partition, None)
            self._released({partition})
            log.info("released partition %d", partition)
        resync = (taken | self._resync) & self.locks.held()
        self._resync.clear()
        if taken:
            await self._check_identity()
        for partition in sorted(resync):
            state = await self.store.partition_state(partition)
            if state is None:
                raise LogIdentityError(f"the ledger has no offset row for partition {partition}")
            self._owned[partition] = state.next_offset
            if self.follower is not None:
                await self.follower.took(partition, state.next_offset)
            if partition in taken:
                self.stats.owned_since[partition] = time.monotonic()
                log.info("took partition %d at offset %d", partition, state.next_offset)
                await self._catch_up_facts(partition, state.next_offset)
        if dropped or resync:
            await self._assign()

    async def _assign(self) -> None:
        assert self._reader is not None
        self._held.clear()  # the reader goes back to the stored offsets and reads them again
        await self._reader.assign(
            {p: o for p, o in self._owned.items() if p not in self.stats.halted}
        )
        if self.carried is not None:
            self.carried.parked = frozenset()  # an assignment parks nothing

    async def _check_identity(self) -> None:
        """On every ownership change: offset 0 still holds the epoch the ledger was built from."""
        identity = await self.log.identity()
        await self.store.bind_log(identity)

    async def _apply(self, partition: int, records: list[Entry]) -> int:
        # Decoding, folding and the facts' JSON allocate heavily and make almost no cycles.
        with gc_paused():
            return await self._apply_records(partition, records)

    async def _apply_records(self, partition: int, records: list[Entry]) -> int:
        start = self._owned[partition]
        keys = self.store.verify_keys
        batch, handed = decode_entries(partition, records, start, keys, self.decode)
        verdicts: list[Verdict] = []
        folded: list[Folded] | None = None
        if self.follower is not None:
            halted = batch.halted is not None
            fresh = await self.follower.folding(partition, batch.items, batch.next_offset, halted)
            folded = all_folded(batch.items, handed, fresh)
        if batch.next_offset > start:
            if not await self.locks.confirmed(partition):
                self._lease_lapsed(partition)
                return 0
            await self._publish_dead(partition, batch.dead)
            try:
                with BatchSpans(self.log.topic, partition, batch.items) as spans:
                    applied = await self._write(
                        partition, start, batch.next_offset, batch.items, folded
                    )
                    spans.applied(applied.verdicts)
            except OffsetConflict as conflict:
                self.stats.conflicts += 1
                log.warning("%s; re-reading its position", conflict)
                self._owned.pop(partition, None)
                self._held.pop(partition, None)
                self._released({partition})
                self._resync.add(partition)
                self._next_ownership = 0.0
                return 0
            verdicts = applied.verdicts
            self._owned[partition] = batch.next_offset
            if self.follower is not None:
                self.follower.committed(partition, batch.next_offset)
            self.stats.applied += len(verdicts)
            self.stats.dead_letters += len(batch.dead)
            self.stats.batches += 1
            if self.facts is not None:
                await self._publish_facts(partition, applied, batch.next_offset)
            elif self.on_verdicts is not None and verdicts:
                await self.on_verdicts(partition, verdicts)
        if batch.halted is not None:
            log.error(batch.halted)
            self.stats.halted[partition] = batch.halted
            await self._record_halt(partition, batch.halted)
            await self._assign()
        return len(verdicts)

    async def _record_halt(self, partition: int, reason: str) -> None:
        """Write the halt beside the partition's offset now, where readers of other processes
        look (a reader waiting at the read barrier fails at once instead of for its whole
        bound; `toolledger status`); the health loop writes it again if this fails."""
        try:
            await self.store.record_halt(partition, self._owned[partition], reason)
        except Exception as exc:
            log.warning("partition %d's halt not recorded yet (%r)", partition, exc)

    def _lease_lapsed(self, partition: int) -> None:
        """This process stalled past its lease and its lock session is gone: the partition is
        someone else's, so the batch is not written (`PartitionLocks.confirmed`)."""
        log.warning("partition %d: the lease lapsed, its lock is gone; not writing", partition)
        self._owned.pop(partition, None)
        self._held.pop(partition, None)
        self._released({partition})
        self._next_ownership = 0.0

    async def _write(
        self,
        partition: int,
        start: int,
        next_offset: int,
        items: list[Positioned | DeadLetter],
        folded: list[Folded] | None,
    ) -> AppliedBatch:
        """The store writes the batch as the follower folded it, or folds it itself."""
        if folded is None:
            self.stats.folded_here += len(items)
            return await self.store.apply_written(partition, start, next_offset, items)
        self.stats.written_folded += len(items)
        return await self.store.apply_folded(partition, start, next_offset, folded)

    def _released(self, partitions: set[int]) -> None:
        if self.follower is not None:
            for partition in partitions:
                self.follower.released(partition)

    async def _publish_facts(self, partition: int, applied: AppliedBatch, next_offset: int) -> None:
        """Publish a committed batch's facts while the next batch is fetched and applied.

        Waiting for Kafka to acknowledge every fact before fetching again made the projector's
        cycle the sum of applying and publishing; now it is the larger of the two. One batch's
        facts are in flight at a time: the next batch's wait for them, which keeps facts in log
        order and bounds what is in flight. The published mark moves only after a batch's facts
        are acknowledged, so a crash republishes from the mark (at least once, as before), and
        `on_verdicts` still hears of verdicts only once their facts are out. A failure to publish
        stops the projector as it did before (from the next step); the next owner republishes.

        With `facts_in_background=False` (the embedded stack, whose facts log is in memory and
        answers at once) they are published before this returns: a task per batch bought
        nothing there, and cost more than publishing.
        """
        await self._facts_sent()
        facts = facts_of(applied.history, applied.verdicts, applied.verdict_json())
        if not self.facts_in_background:
            await self._send_facts(partition, facts, applied.verdicts, next_offset)
            return
        self._facts_in_flight = asyncio.create_task(
            self._send_facts(partition, facts, applied.verdicts, next_offset),
            name="toolledger-facts",
        )

    async def _send_facts(
        self, partition: int, facts: list[FactText], verdicts: list[Verdict], next_offset: int
    ) -> None:
        assert self.facts is not None
        await self.facts.publish(facts)
        if self.facts.mark_due(partition):
            try:
                await self.store.mark_facts_published(partition, next_offset)
            except database_errors() as exc:  # a stale mark only means more republishing later
                log.warning("could not record the facts published (%s)", exc)
        if self.on_verdicts is not None and verdicts:
            await self.on_verdicts(partition, verdicts)

    async def _facts_sent(self) -> None:
        """Wait for the facts in flight; raises what publishing them raised."""
        task, self._facts_in_flight = self._facts_in_flight, None
        if task is not None:
            await task

    async def _catch_up_facts(self, partition: int, next_offset: int) -> None:
        """Republish facts a previous owner committed but may not have published (at least once)."""
        if self.facts is None:
            return
        await self._facts_sent()
        published = await self.store.facts_published(partition)
        while published < next_offset:
            facts = await self.store.facts_since(partition, published, limit=self.batch_size)
            if not facts:
                break
            await self.facts.publish([fact_text(fact) for fact in facts])
            published = facts[-1].offset + 1
        await self.store.mark_facts_published(partition, next_offset)

    async def _publish_dead(self, partition: int, dead: list[DeadLetter]) -> None:
        """Copy dead letters to the DLQ topic before their offsets commit (at least once)."""
        if self.dlq is None:
            return
        for letter in dead:
            headers = [
                ("reason", letter.reason.encode()),
                ("partition", str(partition).encode()),
                ("offset", str(letter.offset).encode()),
                ("topic", self.log.topic.encode()),
            ]
            await self.dlq.append(letter.run_id or "", letter.payload, headers)


def all_folded(
    items: Sequence[Positioned | DeadLetter], handed: dict[int, Folded], fresh: list[Folded]
) -> list[Folded] | None:
    """Each item's fold results, from what the follower handed over and what it folded now;
    None unless it folded every item (then the store folds the batch itself)."""
    if len(handed) + len(fresh) != len(items):
        return None
    now = {f.item.offset: f for f in fresh}
    found = [handed.get(item.offset) or now.get(item.offset) for item in items]
    return None if None in found else found  # type: ignore[return-value]


def _loop_time(monotonic: float) -> float:
    """`time.monotonic()` seconds on the running loop's clock (the same clock, by default)."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic - time.monotonic())
