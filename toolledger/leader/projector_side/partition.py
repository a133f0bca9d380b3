"""One partition as its leader holds it in memory: a fold of the log whose provenance is known.

The leader answers a request with the verdict of its record the moment the record's offset is
known, without waiting for PostgreSQL. That answer is right only if the state it was decided
against is the fold of the log prefix before that offset. `LeaderPartition` keeps exactly that
and nothing else, with no I/O (the asyncio shell in `appender`, beside it, does the produces,
fetches and reads, and `tests/unit/test_leader_stateful.py` drives this class through
every order of them):

- `next` is the next offset folded in memory. Records are folded strictly in offset order
  (`fold`), whoever wrote them: the leader's own batch once Kafka acknowledged it, or foreign
  records (the API, processors, a runtime on the direct path, another leader) fetched to fill
  the gap before it. Records below `next` are folded already and skipped, so the same record
  arriving by acknowledgement and by fetch is folded once.
- Records are decided by `LedgerFold`, the same fold over the same pure decider as every
  projection and replay, so the leader cannot disagree with them on what a record means.
- **Provenance.** Memory holds every call, run and event_id folded since `horizon` (ownership,
  or the last time memory was dropped). Anything else comes from PostgreSQL, read in one
  statement with the partition's stored offset `S` (`Loaded`), and is used only if `S` is this
  process's own last commit (or the one it is committing): then those rows are the fold of the
  log before `S`, and nothing in `[S, next)` touched them or memory would know them. Any other
  `S` means another owner committed: the partition is `superseded` and answers nothing more,
  even though a zombie's folds stay correct, because its writes will fail the offset CAS and
  runtimes must go where the rows are being written.
- **Whole runs.** A run PostgreSQL has no row for (read that way, with provenance) has no
  calls there either: every accepted event writes its run's row, a rejected one writes no call,
  and rows are never deleted. A run that has a row is read with all its calls when it has at
  most `RUN_CALLS_LOADED` (`Loaded.whole`). Either way nothing in `[S, next)` named the run, or
  memory would know it, so from then on memory knows every key of that run without asking: one
  it never folded or loaded does not exist (`knows`). A new agent run's reservations, and a
  resumed run's replays and new calls, therefore cost no read at all; only whether their
  event_ids were decided before (a resend) is asked, beside the produce.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from toolledger.errors import ToolLedgerError
from toolledger.events.fold import DeadLetter, Folded, LedgerFold, Positioned
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.events.signing import VerifyKeys

Item = Positioned | DeadLetter

#: Entries (calls, runs, verdicts) past which memory is dropped at the next point where every
#: folded record is committed, so a long-lived leader does not hold its whole partition.
MEMORY_CAP = 200_000


class LeaderSuperseded(ToolLedgerError):
    """This process no longer leads the partition: stop answering for it."""

    code = "leader_superseded"


class LeaderBehind(LeaderSuperseded):
    """Memory skipped a batch (`LeaderPartition.skip`) and waits for its commit to start
    afresh; until then nothing can be proven from it (the answer is "await the durable one")."""

    code = "leader_behind"


@dataclass(frozen=True)
class Needs:
    """What PostgreSQL must be asked before some records can be folded."""

    keys: frozenset[str] = frozenset()
    runs: frozenset[str] = frozenset()
    event_ids: frozenset[uuid.UUID] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.keys or self.runs or self.event_ids)


@dataclass(frozen=True)
class Loaded:
    """The answer to `Needs`: rows read in one statement with the stored offset `stored`.

    `decided` holds the verdicts of the asked event_ids that were decided before (resends);
    `generation` is the partition's generation when the read was asked (`LeaderPartition`);
    `whole` names the asked runs whose calls `calls` holds all of (see "Whole runs").
    """

    stored: int
    needs: Needs
    calls: dict[str, CallRecord] = field(default_factory=dict)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    decided: dict[uuid.UUID, Verdict] = field(default_factory=dict)
    generation: int = 0
    #: Asked runs that have a row and were read with every call they have (in `calls`).
    whole: frozenset[str] = frozenset()


class LeaderPartition:
    """The leader's fold of one partition from `next_offset` on (see the module docstring)."""

    def __init__(self, partition: int, next_offset: int, keys: VerifyKeys) -> None:
        self.partition = partition
        self.next = next_offset
        self.horizon = next_offset
        self.committed = next_offset
        self.pending: int | None = None
        self._commits = {next_offset}
        self.superseded: str | None = None
        #: Set by `skip`: memory is missing a batch the projector is committing.
        self.behind = False
        self.generation = 0
        self._verify = keys
        self._fold = LedgerFold(keys=keys, with_history=False)
        self._keys: set[str] = set()
        self._runs: set[str] = set()
        #: Runs memory knows every call of: PostgreSQL had no row for them, or gave all their
        #: calls with the row, when memory learnt them (see "Whole runs").
        self._whole: set[str] = set()
        self._undecided: set[uuid.UUID] = set()

    # -- what memory knows ------------------------------------------------------------------

    def needs(self, items: Iterable[Item]) -> Needs:
        """What must be loaded before `items` can be folded (nothing for known ones)."""
        keys: set[str] = set()
        runs: set[str] = set()
        event_ids: set[uuid.UUID] = set()
        for item in items:
            if isinstance(item, DeadLetter):
                if item.run_id is not None and item.run_id not in self._runs:
                    runs.add(item.run_id)
                continue
            event = item.event
            if event.run_id not in self._runs:
                runs.add(event.run_id)
            if event.tool_call_id is not None and not self.knows(event.key):
                keys.add(event.key)
            if not self.knows_event(event.event_id):
                event_ids.add(event.event_id)
        return Needs(frozenset(keys), frozenset(runs), frozenset(event_ids))

    def learn(self, loaded: Loaded) -> None:
        """Take in rows read from PostgreSQL, if their provenance holds (else `LeaderSuperseded`).

        A row of a key memory already knows is ignored: memory is newer. Rows read before
        memory was dropped (another `generation`) are ignored too; ask again.
        """
        self.check_stored(loaded.stored)
        if loaded.generation != self.generation:
            return
        fold = self._fold
        for key in loaded.needs.keys:
            if self.knows(key):
                continue
            if key in loaded.calls:
                fold.calls[key] = loaded.calls[key]
            self._keys.add(key)
        whole = set()
        for run_id in loaded.needs.runs - self._runs:
            if run_id in loaded.runs:
                fold.runs[run_id] = loaded.runs[run_id]
                if run_id in loaded.whole:
                    whole.add(run_id)
            else:
                whole.add(run_id)
            self._runs.add(run_id)
        if whole:
            for key, call in loaded.calls.items():
                if call.run_id in whole and not self.knows(key):
                    fold.calls[key] = call
                    self._keys.add(key)
            self._whole |= whole
        for event_id in loaded.needs.event_ids:
            if event_id in loaded.decided:
                fold.verdicts.setdefault(event_id, loaded.decided[event_id])
            elif event_id not in fold.verdicts:
                self._undecided.add(event_id)

    def check_stored(self, stored: int) -> None:
        """`LeaderSuperseded` unless `stored` is one of this leader's own commits or the coming one.

        Not only the last: a read may have been asked before the projector's latest commit
        and answered after it. Every commit since `horizon` was a compare-and-set from the one
        before, so the offset moved through exactly those values while this process owned it.
        """
        self.check_current()
        if stored not in self._commits and stored != self.pending:
            self.supersede(
                f"partition {self.partition}: PostgreSQL holds next offset {stored}, but this "
                f"leader last committed {self.committed}; another owner has taken it over"
            )
            raise LeaderSuperseded(self.superseded or "")

    def supersede(self, why: str) -> None:
        self.superseded = why

    def check_current(self) -> None:
        """`LeaderSuperseded` (or `LeaderBehind`) unless memory may answer now."""
        if self.superseded is not None:
            raise LeaderSuperseded(self.superseded)
        if self.behind:
            raise LeaderBehind(
                f"partition {self.partition}: memory skipped the batch up to {self.pending}, "
                "which is being committed; await the durable verdict"
            )

    # -- folding ----------------------------------------------------------------------------

    def fold(self, items: Sequence[Item], end: int) -> list[Folded]:
        """Fold the records of `[start, end)` not folded yet; `items` are in offset order and
        start at or before `next`. Everything they name must be known (`needs` is empty).
        Returns what folding decided for each record folded now (`Folded`), which the
        projection writes as it is instead of folding those records again."""
        self.check_current()
        if items and items[0].offset > self.next:
            raise ValueError(
                f"partition {self.partition}: records from offset {items[0].offset} cannot be "
                f"folded before offset {self.next}"
            )
        fresh = [item for item in items if item.offset >= self.next]
        if self.needs(fresh):
            raise ValueError(f"partition {self.partition}: folding records not loaded first")
        fold = self._fold
        folded: list[Folded] = []
        for item in fresh:
            if item.offset != self.next:
                raise ValueError(
                    f"partition {self.partition}: record at {item.offset}, expected {self.next}"
                )
            folded.append(fold.folded(item))
            if isinstance(item, Positioned):
                self._undecided.discard(item.event.event_id)
            self.next = item.offset + 1
        self.next = max(self.next, end)
        return folded

    def verdict(self, event_id: uuid.UUID) -> Verdict | None:
        """The verdict of a folded (or earlier decided) event_id."""
        return self._fold.verdicts.get(event_id)

    def call(self, key: str) -> CallRecord | None:
        """The key's record as of `next`; only meaningful if `knows(key)`."""
        return self._fold.calls.get(key)

    def knows(self, key: str) -> bool:
        """Whether memory holds `key`'s record, or knows it has none: learnt, or of a whole
        run (a run_id holds no ':', so the key's run is what comes before the first one)."""
        return key in self._keys or key.split(":", 1)[0] in self._whole

    def knows_run(self, run_id: str) -> bool:
        return run_id in self._runs

    def knows_event(self, event_id: uuid.UUID) -> bool:
        """Whether memory knows if `event_id` was decided (its verdict, or that it has none)."""
        return event_id in self._fold.verdicts or event_id in self._undecided

    # -- commits ----------------------------------------------------------------------------

    def committing(self, end: int) -> None:
        """The projector is about to commit up to `end` (all of it folded here already)."""
        self.pending = end

    def skip(self, end: int) -> None:
        """The projector is about to commit up to `end` and memory will not fold it (nobody
        asked this leader for a while: folding every batch twice would only cost the projector).
        Until that commit, nothing is answered from memory (`LeaderBehind`); after it, memory starts
        empty at `end`."""
        self.pending = end
        self.behind = True

    def committed_to(self, end: int) -> None:
        """The projector committed up to `end`; memory may be dropped if it is all committed."""
        self.committed = end
        self.pending = None
        self._commits.add(end)
        if len(self._commits) > 4096:
            self._commits = set(sorted(self._commits)[-1024:])
        fold = self._fold
        size = len(fold.calls) + len(fold.runs) + len(fold.verdicts)
        if self.behind or (self.next == end and size > MEMORY_CAP):
            self.behind = False
            self.next = end
            self._fold = LedgerFold(keys=self._verify, with_history=False)
            self._keys.clear()
            self._runs.clear()
            self._whole.clear()
            self._undecided.clear()
            self._commits = {end}
            self.horizon = end
            self.generation += 1
