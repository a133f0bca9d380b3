"""Append and prove: one partition's batches, from the runtimes' requests to their verdicts.

Requests for a partition queue up while the previous batch is in flight and go out together:
every record of the batch is sent at once, so the producer packs them into one produce request
(acks=all), and each acknowledgement says the record's offset. While Kafka acknowledges, the
rows the batch names that memory does not hold are read from PostgreSQL with the partition's
stored offset (`toolledger.leader.projector_side.reads`), so the read costs no extra wait.

Then the proof, under the partition's lock (the projector's hook takes it too, so the two
never fold at once): if the batch's first offset is the next offset memory has folded to,
nobody wrote in between and the batch is folded as it is. If it is further on, the records in
between are foreign: they are fetched at once from a reader of this process's own, folded
first, and then the batch. If memory is already past the batch (the projector's fetch brought
the same records first), the verdicts are simply there. Every verdict is therefore the fold of
the log up to its record, whoever else writes to the partition.

What cannot be proven is never guessed: a produce that failed (it may still land: the runtime
resends the same event_id on the direct path), a gap that will not come, a superseded partition.
Each is answered as such (`Answer`), and the runtime awaits the durable verdict instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from toolledger.events.codec import decode
from toolledger.events.fold import Folded, Positioned
from toolledger.events.log import EventLog, LogError, LogReader, Position
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.events.signing import VerifyKeys
from toolledger.leader.projector_side.partition import (
    Item,
    LeaderPartition,
    LeaderSuperseded,
    Loaded,
    Needs,
)
from toolledger.leader.runtime_side.frames import Kind
from toolledger.projections.decoding import decode_records
from toolledger.projections.following import Proven

log = logging.getLogger("toolledger.leader")

#: Seconds a batch's produce may take before its requests are answered "not proven".
PRODUCE_BOUND = 5.0
#: Seconds the records before an acknowledged offset may take to be fetched.
GAP_BOUND = 2.0
#: Seconds after its last request that a partition's memory stops following the projector's
#: batches (`LeaderPartition.skip`): a partition nobody asks costs the projector nothing.
IDLE_AFTER = 30.0
#: Proven records kept for the projector (`proven`), at most: past it they are dropped, and the
#: projector, which is not taking them (skipping, halted), fetches instead.
PROVEN_CAP = 20_000

Load = Callable[[int, Needs, int], Coroutine[Any, Any, Loaded]]


@dataclass(frozen=True)
class Answer:
    """What a request is answered with: a `Kind` and, for a verdict, the verdict."""

    kind: Kind
    verdict: Verdict | None = None
    detail: str = ""
    offset: int | None = None
    #: The verdict's `model_dump_json()`, made once for the answer and the projection.
    verdict_json: str | None = None


@dataclass
class _Wanted:
    """Keys, runs and event_ids that reads are waiting for, loaded together in one statement."""

    keys: set[str]
    runs: set[str]
    event_ids: set[uuid.UUID]
    loaded: asyncio.Future[None]


@dataclass
class _Request:
    event: Event
    data: bytes
    answer: asyncio.Future[Answer]


class GapReader:
    """Fetches a partition's records between two offsets, on a reader of its own."""

    def __init__(self, events: EventLog, keys: VerifyKeys) -> None:
        self._events = events
        self._keys = keys
        self._reader: LogReader | None = None
        self._lock = asyncio.Lock()

    async def between(self, partition: int, start: int, end: int) -> list[Item]:
        """The decoded records of `[start, end)` (fewer if the bound passes first)."""
        async with self._lock:
            if self._reader is None:
                self._reader = self._events.reader()
            await self._reader.assign({partition: start})
            items: list[Item] = []
            at = start
            give_up = time.monotonic() + GAP_BOUND
            while at < end and time.monotonic() < give_up:
                fetched = await self._reader.fetch(max_wait=0.005, max_records=end - at)
                records = [r for r in fetched.get(partition, []) if at <= r.offset < end]
                batch = decode_records(partition, records, at, self._keys, decode)
                if batch.halted is not None:
                    raise LeaderSuperseded(batch.halted)
                items.extend(batch.items)
                at = batch.next_offset
            return items

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()


class PartitionAppender:
    """Batches, appends and proves one partition's requests (see the module docstring)."""

    def __init__(
        self, state: LeaderPartition, events: EventLog, load: Load, gaps: GapReader
    ) -> None:
        self.state = state
        self.lock = asyncio.Lock()
        self._events = events
        self._load = load
        self._gaps = gaps
        self._queue: list[_Request] = []
        self._flusher: asyncio.Task[None] | None = None
        self._wanted: _Wanted | None = None
        self._loader: asyncio.Task[None] | None = None
        self._asked = -IDLE_AFTER
        #: The records this leader folded in `_prove` (its own and the foreign ones before
        #: them), with what the fold decided, in offset order, until its projector takes them
        #: (`take_proven`) instead of fetching and folding them again; `on_proven` is told
        #: when there are more.
        self.proven: list[Proven] = []
        self.on_proven: Callable[[int], None] | None = None
        #: Batches appended and not yet proven: each proof fetches what lies before it.
        self.proving = 0

    def take_proven(self, start: int) -> list[Proven] | None:
        """The proven records from offset `start` on, as far as they run without a hole; those
        before `start` are dropped. None if memory has folded past `start` but the records
        there are not here (dropped at the cap; they are the projector's to fetch).

        Everything memory folds after the projector's position is proven here, except what
        the projector fetched itself and `LeaderServer.folding` folded (a hole, where the
        projector's position is past it anyway), so None is rare."""
        proven = self.proven
        first = 0
        while first < len(proven) and proven[first].offset < start:
            first += 1
        if first == len(proven) or proven[first].offset != start:
            del proven[:first]
            return None if self.state.next > start else []
        last = first + 1
        while last < len(proven) and proven[last].offset == proven[last - 1].offset + 1:
            last += 1
        taken = proven[first:last]
        del proven[:last]
        return taken

    def in_use(self) -> bool:
        """Whether a runtime asked for this partition in the last `IDLE_AFTER` seconds."""
        return time.monotonic() - self._asked < IDLE_AFTER

    def asked(self) -> None:
        self._asked = time.monotonic()

    async def submit(self, event: Event, data: bytes) -> Answer:
        """Append `event` (encoded as `data`) in the next batch; its answer once proven."""
        self.asked()
        request = _Request(event, data, asyncio.get_running_loop().create_future())
        self._queue.append(request)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="toolledger-leader-batch")
        return await request.answer

    async def learn_call(self, key: str, run_id: str, event_id: uuid.UUID | None = None) -> None:
        """Have memory know `key` and its run, reading PostgreSQL for them if it does not;
        and, for a `RESERVE`, whether its `event_id` was decided before (a resend), which the
        append would otherwise ask in a statement of its own.

        The reads waiting at one time are answered by one statement (and the calls that start
        while it runs by the next), so 64 calls reading their keys cost a leader one or two
        round trips, not 64. They need not hold `lock`: `LeaderPartition.learn` checks the
        rows' provenance when they arrive and ignores what memory learned meanwhile, and no
        record of a key memory does not know can have been folded (folding needs it known).
        """
        state = self.state
        if state.knows(key) and state.knows_run(run_id):
            return
        wanted = self._wanted
        if wanted is None:
            loaded = asyncio.get_running_loop().create_future()
            wanted = self._wanted = _Wanted(set(), set(), set(), loaded)
        wanted.keys.add(key)
        wanted.runs.add(run_id)
        if event_id is not None:
            wanted.event_ids.add(event_id)
        if self._loader is None or self._loader.done():
            self._loader = asyncio.create_task(self._load_wanted(), name="toolledger-leader-read")
        await asyncio.wait([wanted.loaded])  # one reader's cancellation cancels no one else's
        wanted.loaded.result()

    async def _load_wanted(self) -> None:
        while (wanted := self._wanted) is not None:
            self._wanted = None
            state = self.state
            needs = Needs(
                keys=frozenset(k for k in wanted.keys if not state.knows(k)),
                runs=frozenset(r for r in wanted.runs if not state.knows_run(r)),
                event_ids=frozenset(e for e in wanted.event_ids if not state.knows_event(e)),
            )
            try:
                if needs:
                    state.learn(await self._load(state.partition, needs, state.generation))
            except BaseException as exc:
                _settle(wanted.loaded, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                _settle(wanted.loaded, None)

    async def close(self) -> None:
        """Stop; whatever is queued or in flight is answered `UNAVAILABLE` (it may have been
        appended: the runtime resends it on the direct path, with the same event_id)."""
        if self._loader is not None:
            self._loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loader
        if self._wanted is not None:
            _settle(self._wanted.loaded, LeaderSuperseded("the leader stopped"))
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        _answer_all(self._queue, Answer(Kind.UNAVAILABLE, detail="the leader stopped"))

    async def ensure_known(self, items: Sequence[Item]) -> None:
        """Load what memory lacks to fold `items` (call it holding `lock`)."""
        state = self.state
        needs = state.needs(items)
        while needs:
            state.learn(await self._load(state.partition, needs, state.generation))
            needs = state.needs(items)

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            self.proving += 1
            try:
                answers = await self._prove(batch)
            except asyncio.CancelledError:
                _answer_all(batch, Answer(Kind.UNAVAILABLE, detail="the leader stopped"))
                raise
            except LeaderSuperseded as exc:
                answers = [Answer(Kind.APPENDED, detail=str(exc))] * len(batch)
            except Exception as exc:  # never let one batch take the leader down
                log.exception("partition %d: batch not proven", self.state.partition)
                answers = [Answer(Kind.UNAVAILABLE, detail=f"{type(exc).__name__}: {exc}")] * len(
                    batch
                )
            finally:
                self.proving -= 1
            for request, answer in zip(batch, answers, strict=True):
                if not request.answer.done():
                    request.answer.set_result(answer)

    async def _prove(self, batch: list[_Request]) -> list[Answer]:
        state = self.state
        partition = state.partition
        needs = state.needs(Positioned(partition, state.next, r.event) for r in batch)
        loading = (
            asyncio.create_task(self._load(partition, needs, state.generation)) if needs else None
        )
        try:
            positions = await self._produce(batch)
        except (LogError, TimeoutError) as exc:
            if loading is not None:
                loading.cancel()
            detail = f"append to partition {partition} not acknowledged ({exc}); resend it"
            return [Answer(Kind.UNAVAILABLE, detail=detail)] * len(batch)
        own = {
            p.offset: Positioned(partition, p.offset, r.event)
            for p, r in zip(positions, batch, strict=True)
        }
        texts: dict[int, str | None] = {}  # the own records' verdicts, as JSON
        async with self.lock:
            if loading is not None:
                state.learn(await loading)
            target = max(own) + 1
            while state.next < target:
                if state.next in own:  # ours, as many as follow one another
                    end = state.next
                    while end in own:
                        end += 1
                    items: list[Item] = [own[o] for o in range(state.next, end)]
                else:  # foreign records before (or between) ours: fetch them now
                    upto = min([o for o in own if o > state.next] + [target])
                    items = await self._gaps.between(partition, state.next, upto)
                    if not items:
                        raise LeaderSuperseded(
                            f"partition {partition}: records from offset {state.next} did not "
                            f"arrive within {GAP_BOUND}s"
                        )
                await self.ensure_known(items)
                folded = state.fold(items, items[-1].offset + 1)
                proven = [_proven(f, f.item.offset in own) for f in folded]
                texts.update((p.offset, p.folded.verdict_json) for p in proven if p.own)
                self._hand_over(proven)  # at once: what memory folded, `proven` holds
        answers: list[Answer] = []
        for position, request in zip(positions, batch, strict=True):
            verdict = state.verdict(request.event.event_id)
            if verdict is None:  # cannot happen: folded above, or decided earlier
                answers.append(Answer(Kind.APPENDED, detail="no verdict in memory"))
            else:
                text = texts.get(position.offset)
                answers.append(
                    Answer(Kind.VERDICT, verdict, offset=position.offset, verdict_json=text)
                )
        return answers

    def _hand_over(self, proven: list[Proven]) -> None:
        """Keep `proven` for the projector, which is told, unless it is not taking them."""
        if not proven:
            return
        if len(self.proven) + len(proven) > PROVEN_CAP:
            self.proven.clear()  # not taken (skipping, halted): the projector fetches instead
        self.proven.extend(proven)
        if self.on_proven is not None:
            self.on_proven(self.state.partition)

    async def _produce(self, batch: list[_Request]) -> list[Position]:
        """Send every record at once (one produce request) and wait for every offset. No hint
        goes out: the records are handed to this process's projector (`take_proven`)."""
        records = [(r.event.run_id, r.data) for r in batch]
        async with asyncio.timeout(PRODUCE_BOUND):
            positions = await self._events.append_many(records, hint=False)
        for position in positions:
            if position.partition != self.state.partition:
                raise LogError(
                    f"a record for partition {self.state.partition} landed in partition "
                    f"{position.partition}: the runtime and the leader disagree on the "
                    "partition count"
                )
        return list(positions)


def _proven(folded: Folded, own: bool) -> Proven:
    """`folded` for the projector; the verdict of a record of its own made into JSON once,
    for its answer and for the projection (a resend's verdict, decided before, is not in it)."""
    if own and folded.verdict is not None:
        folded = folded._replace(verdict_json=folded.verdict.model_dump_json())
    return Proven(folded, own)


def _settle(loaded: asyncio.Future[None], error: BaseException | None) -> None:
    """Answer the readers of one statement: each re-raises `error` for itself, if any."""
    if loaded.done():
        return
    if error is None:
        loaded.set_result(None)
    else:
        loaded.set_exception(error)
        loaded.exception()  # retrieved here, so an unread one is not logged as lost


def _answer_all(requests: list[_Request], answer: Answer) -> None:
    for request in requests:
        if not request.answer.done():
            request.answer.set_result(answer)
