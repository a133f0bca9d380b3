"""LedgerStack: the parts of a ledger assembled for one process, embedded or against services.

`LedgerStack.memory()` is the embedded default: a memory log, a memory ledger and an in-process
projector, for the demo and for users' unit tests. `LedgerStack.connect(settings)` talks to Kafka
and PostgreSQL; it runs a projector only when asked (`toolledger projector` does), because in
production projectors are their own processes; a stack that runs one needs the public keys
(`ProjectorSettings.verify_keys`, read from the environment when `settings` is the shared
block) and refuses to start without them. Its runtime-side reads (a call's record, a
verdict) share one PostgreSQL connection of their own, opened on first use
(`toolledger.projections.postgres_reads` says why). The Kafka and PostgreSQL adapters are
imported by `connect()` only, so the embedded stack never loads aiokafka or asyncpg. Every
append to the events topic is hinted to the projector that owns its partition, in process or
through PostgreSQL (`toolledger.projections.hints`), so an idle projector can stop polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from toolledger.events.codec import default_codec
from toolledger.events.log import DEFAULT_MAX_RECORD_BYTES, EventLog
from toolledger.events.memory import MemoryBroker
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import Verdict
from toolledger.events.signing import SigningKey, VerifyKeys
from toolledger.projections.barrier import ReadBarrier
from toolledger.projections.facts import FactsPublisher
from toolledger.projections.fresh import FreshReads
from toolledger.projections.hints import AppendHints, HintListener, hint_channel_for
from toolledger.projections.listening import PostgresListener
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.ownership import MemoryPartitionLocks
from toolledger.projections.projector import Projector, VerdictSink
from toolledger.projections.reads import CallReads, PointReads, StoreReads
from toolledger.projections.store import LedgerStore
from toolledger.projections.verdicts import PostgresNotifications, VerdictWaiter
from toolledger.settings import ProjectorSettings, Settings, load_settings
from toolledger.wiring.commands import LedgerCommands

if TYPE_CHECKING:
    from toolledger.leader.runtime_side.connection import LeaderDirectory

log = logging.getLogger("toolledger.wiring.stack")

#: The facts producer's batch per partition. The projector publishes a whole batch of verdicts
#: at once and aiokafka keeps one request in flight per broker, so with its 16 KB default
#: (8 facts of ~2 KB) publishing capped catch-up below 1,000 events/s here (BENCHMARKS.md).
FACTS_BATCH_BYTES = 512 * 1024
#: Seconds `LedgerStack.close` waits for each of its background tasks after cancelling it.
TASK_STOP_TIMEOUT = 15.0


@dataclass
class LedgerStack:
    """Everything one process uses to append requests and read the ledger."""

    events: EventLog
    facts: EventLog
    dlq: EventLog
    store: LedgerStore
    waiter: VerdictWaiter
    commands: LedgerCommands
    call_reads: CallReads
    #: The ledger's reads behind the read barrier (`toolledger.projections.fresh`): what the
    #: operator service, the processors and a runtime's runs and lists read.
    reads: FreshReads
    projector: Projector | None = None
    #: Where the partitions' leaders are (`TOOLLEDGER_LEADER=auto`): the read barrier asks
    #: them for read indexes and keys' records (`toolledger.wiring.leader_index`).
    leaders: LeaderDirectory | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _listeners: list[PostgresListener] = field(default_factory=list)
    _reads: list[PointReads] = field(default_factory=list)
    #: Closed first by `close` (the leader server, a runtime's leader connections).
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @classmethod
    async def memory(
        cls,
        *,
        partitions: int = 4,
        verify_keys: VerifyKeys | None = None,
        broker: MemoryBroker | None = None,
        limits: PayloadLimits | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        read_barrier_timeout: float = 5.0,
    ) -> LedgerStack:
        """The embedded stack. Its projector verifies operator signatures with `verify_keys`;
        without them, with the public half of a key nobody holds, so no decision is accepted.
        `limits` and `max_record_bytes` are the same settings, with the same defaults, as
        against Kafka: the memory log refuses what Kafka would refuse. Its reads wait for the
        in-process projector to fold every record appended before them (the memory log's end
        is exact), up to `read_barrier_timeout` seconds, so a read right after `call` returned
        sees how the call ended."""
        if verify_keys is None:
            verify_keys = SigningKey.generate("nobody").verify_keys()
        # The projector decodes in this process what the commands encode in it.
        default_codec().remember_encoded()
        broker = broker or MemoryBroker()
        events = broker.log("toolledger.events", max_record_bytes)
        await events.ensure_topic(partitions)
        facts = broker.log("toolledger.ledger")
        dlq = broker.log("toolledger.events.dlq")
        for topic in (facts, dlq):
            await topic.create_topic(partitions)
        store = MemoryLedger(verify_keys=verify_keys)
        await store.start()
        await store.register_verify_keys()
        point = StoreReads(store)
        waiter = VerdictWaiter(point)
        barrier = ReadBarrier(events, point, timeout=read_barrier_timeout)
        projector = Projector(
            events,
            store,
            MemoryPartitionLocks(),
            dlq=dlq,
            facts=FactsPublisher(facts),
            on_verdicts=_deliver_to(waiter, barrier),
            fetch_wait_ms=50,
            facts_in_background=False,
        )
        commands = LedgerCommands(events, waiter, store, limits)
        reads = CallReads(point)
        fresh = FreshReads(store, barrier)
        stack = cls(events, facts, dlq, store, waiter, commands, reads, fresh, projector)
        await waiter.start()
        stack._tasks.append(asyncio.create_task(projector.run(), name="toolledger-projector"))
        return stack

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        *,
        run_projector: bool = False,
        create_topics: bool = True,
        listen: bool = True,
        create_schema: bool | None = None,
    ) -> LedgerStack:
        """The stack against Kafka and PostgreSQL. `listen=False` opens no LISTEN connection
        for verdicts: for a process that never waits for a verdict (`toolledger projector`),
        whose every notification would otherwise come back to it as a wake-up for nothing; its
        waiter still polls, should anything wait after all. A stack that runs a projector
        listens for append hints either way (`toolledger.projections.hints`).

        `create_schema` (default: only when it runs a projector) creates the ledger's schema if
        it does not exist; otherwise a missing one is `SchemaMissing`, naming the setting. If
        anything fails on the way, what was opened is closed before the error goes up.
        """
        database_url, _ = settings.require_services()
        if run_projector and not isinstance(settings, ProjectorSettings):
            settings = load_settings(ProjectorSettings, **settings.model_dump())
        opened: list[Callable[[], Awaitable[None]]] = []
        try:
            return await cls._connect(
                settings,
                database_url,
                opened,
                run_projector=run_projector,
                create_topics=create_topics,
                listen=listen,
                create_schema=run_projector if create_schema is None else create_schema,
            )
        except BaseException:
            for close in reversed(opened):
                with contextlib.suppress(Exception):
                    await close()
            raise

    @classmethod
    async def _connect(
        cls,
        settings: Settings,
        database_url: str,
        opened: list[Callable[[], Awaitable[None]]],
        *,
        run_projector: bool,
        create_topics: bool,
        listen: bool,
        create_schema: bool,
    ) -> LedgerStack:
        """`connect`'s assembly; each part it opens is added to `opened` as it opens, so a
        failure half-way closes them (no producer or pool left for the garbage collector)."""
        from toolledger.events.kafka import KafkaLog
        from toolledger.projections.ownership import PostgresPartitionLocks
        from toolledger.projections.postgres import PostgresLedger
        from toolledger.projections.postgres_reads import PostgresReads

        assert settings.kafka_bootstrap is not None
        verify_keys = VerifyKeys()
        if isinstance(settings, ProjectorSettings):
            verify_keys = settings.require_verify_keys() if run_projector else settings.verify_keys
        kafka_log = functools.partial(
            KafkaLog,
            settings.kafka_bootstrap,
            max_record_bytes=settings.max_record_bytes,
            replication_factor=settings.replication_factor,
            idle_bound=settings.idle_fetch_bound_ms / 1000,
        )
        events = kafka_log(settings.events_topic)
        facts = kafka_log(settings.facts_topic, max_batch_size=FACTS_BATCH_BYTES)
        dlq = kafka_log(settings.dlq_topic)
        for topic in (events, facts, dlq):
            opened.append(topic.close)
            await topic.start()
        store = PostgresLedger(
            database_url,
            settings.schema_name,
            verify_keys=verify_keys,
            synchronous_apply=settings.projector_synchronous_commit,
            create=create_schema,
        )
        opened.append(store.close)
        await store.start()
        if create_topics:
            # Not read when it exists: a projector checks the identity when it takes partitions.
            await events.ensure_exists(settings.partitions)
            await facts.create_topic(settings.partitions)
            await dlq.create_topic(1)
        if run_projector:
            await store.register_verify_keys()
        reads = PostgresReads(database_url, settings.schema_name)
        opened.append(reads.close)
        call_reads = CallReads(reads)
        waiter = VerdictWaiter(reads)
        opened.append(waiter.close)
        fresh, leaders = _fresh_reads(settings, events, store, reads)
        barrier = fresh.barrier
        opened.append(barrier.close)
        if leaders is not None:
            opened.append(leaders.close)
        listener = None
        if listen:
            # Every verdict notification is a commit: a reader waiting at the barrier looks.
            listener = PostgresNotifications(
                database_url, store.notify_channel, waiter, on_heard=barrier.hint
            )
            opened.append(listener.close)
            await listener.start()
        await waiter.start()
        projector = None
        leader = None
        if run_projector:
            from toolledger.wiring.projector_leader import (
                start_leader,  # only where a projector runs
            )

            locks = PostgresPartitionLocks(
                database_url,
                settings.schema_name,
                share=settings.projector_ownership == "share",
                lease_s=settings.owner_lease_s,
            )
            leader = await start_leader(settings, events, verify_keys, locks.holds)
            if leader is not None:
                opened.append(leader.close)
            projector = Projector(
                events,
                store,
                locks,
                dlq=dlq,
                facts=FactsPublisher(facts),
                batch_size=settings.batch_size,
                fetch_wait_ms=settings.fetch_wait_ms,
                identity_interval=settings.identity_check_s,
                follower=leader,
                linger_ms=0 if leader is None else settings.leader_commit_linger_ms,
                end_check_ms=settings.idle_fetch_bound_ms,
            )
        commands = LedgerCommands(events, waiter, store, settings.payload_limits())
        stack = cls(
            events, facts, dlq, store, waiter, commands, call_reads, fresh, projector, leaders
        )
        if listener is not None:
            stack._listeners.append(listener)
        hints = hint_channel_for(settings.schema_name)
        if projector is not None:  # other processes' appends reach it through PostgreSQL
            heard = HintListener(database_url, hints, projector.wake)
            opened.append(heard.close)
            await heard.start()
            stack._listeners.append(heard)
        notify = None if listener is None else functools.partial(listener.notify, hints)
        appended = AppendHints(notify, None if projector is None else projector.wake)
        events.on_appended = appended.appended
        stack.on_close.append(appended.close)
        stack._reads.append(reads)
        if leader is not None:
            stack.on_close.append(leader.close)
        if leaders is not None:
            stack.on_close.append(leaders.close)
        if projector is not None:
            stack._tasks.append(asyncio.create_task(projector.run(), name="toolledger-projector"))
        return stack

    @property
    def projector_task(self) -> asyncio.Task[None]:
        """The in-process projector's task (only when this stack runs one)."""
        if self.projector is None or not self._tasks:
            raise RuntimeError("this stack runs no projector")
        return self._tasks[0]

    async def close(self) -> None:
        for close in self.on_close:
            await close()
        if self.projector is not None:
            self.projector.stop()
        for task in self._tasks:
            task.cancel()
            # Bounded: closing must not hang on a task stuck in a call that ignores
            # cancellation for a while (a client library's own shutdown, say).
            done, _ = await asyncio.wait({task}, timeout=TASK_STOP_TIMEOUT)
            if not done:
                log.warning(
                    "%s did not stop in %ss; leaving it", task.get_name(), TASK_STOP_TIMEOUT
                )
            elif not task.cancelled():
                task.exception()  # retrieved, as before: whoever cares reads the task itself
        await self.waiter.close()
        await self.reads.barrier.close()
        for listener in self._listeners:
            await listener.close()
        for reads in self._reads:
            await reads.close()
        await self.store.close()
        for topic in (self.events, self.facts, self.dlq):
            await topic.close()


def _fresh_reads(
    settings: Settings, events: EventLog, store: LedgerStore, positions: PointReads
) -> tuple[FreshReads, LeaderDirectory | None]:
    """The stack's reads behind its read barrier: ends from the broker, raised by the leaders'
    read index and a key read from a leader's memory where `TOOLLEDGER_LEADER=auto`."""
    from toolledger.wiring.leader_index import leader_directory, leader_index

    timeout = settings.read_barrier_timeout_s
    directory = leader_directory(settings)
    if directory is None:
        return FreshReads(store, ReadBarrier(events, positions, timeout=timeout)), None
    from toolledger.leader.runtime_side.index import LeaderEnds

    index = leader_index(directory, settings)
    barrier = ReadBarrier(LeaderEnds(events, index), positions, timeout=timeout)
    return FreshReads(store, barrier, vouchers=index), directory


def _deliver_to(waiter: VerdictWaiter, barrier: ReadBarrier) -> VerdictSink:
    """In-process projector -> waiter: the applied verdicts themselves, no notification and no
    read (the sink hears of a batch only after the store applied it); and a reader waiting at
    the barrier looks again."""

    async def deliver(_partition: int, verdicts: Sequence[Verdict]) -> None:
        for verdict in verdicts:
            waiter.deliver(verdict)
        barrier.hint()

    return deliver
