"""The resumer: hands a paused run back to its host once the call it waits on is settled.

A run pauses (`awaiting_reconciliation`, `awaiting_approval`, `duplicate_intent`) waiting on
one call key. The resumer learns that a wait is over in three ways:

- a call's fact, accepted, whose run record (carried in the verdict) is paused on that very key
  and whose new status ends the wait (settled; decided, for an approval);
- a `run_paused` fact whose awaited call was already settled when the pause landed (the call
  settled first): the call's record is read from the ledger;
- a **sweep** of the ledger's paused runs, when it starts and whenever it takes facts
  partitions over: every run of those partitions whose wait is over is due again. So a resume
  that a crash, a restart or a hook that kept failing left undone is tried again by whichever
  resumer owns the run's partition next (at least once per pause; a resumed run
  re-checkpoints, so a second resume of the same pause is fenced, not doubled).

It then calls the host's hook, `async def resume(run: RunRecord) -> None`, in a task of its own
(`ResumeTasks`), never in the faust agent: the agent only takes note, so no hook, however it
fails, stops the facts from being read. A hook that raises is logged with the run id and called
again after a back-off (`ResumePolicy`, from `TOOLLEDGER_RESUME_MAX_ATTEMPTS` and
`TOOLLEDGER_RESUME_BACKOFF_S`); after the last attempt the resumer appends `run_resume_failed`,
which the decider keeps on the run record (`RunRecord.resume_error`, cleared by the run's next
move): the API, the console and `/metrics` show it, and a replay of the log keeps it, because
it is in the log. Driving the run (model, tools) is the host's: typically
`AgentRun(...).resume()`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

from toolledger.events.log import partition_for
from toolledger.events.models import RunResumeFailed
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.extras import MissingExtra
from toolledger.modules import ModuleLoadError, import_user_module
from toolledger.processors.app import DEFAULT_SESSION_TIMEOUT_S, processor_app
from toolledger.processors.app import facts_topic as facts_topic_of
from toolledger.processors.resume_tasks import ResumePolicy, ResumeTasks, Wait
from toolledger.projections.facts import Fact, facts_in
from toolledger.runtime.pauses import PAUSED, wait_is_over
from toolledger.settings import Settings

try:
    import faust
except ImportError as exc:  # a runtime-only install: say which extra
    raise MissingExtra("server", "faust", "the resumer (a faust processor)") from exc

__all__ = ["ResumeHook", "ResumePolicy", "Resumer", "load_hook", "resumer_app"]

log = logging.getLogger("toolledger.resumer")

ResumeHook = Callable[[RunRecord], Awaitable[None]]
MarkFailed = Callable[[RunResumeFailed], Awaitable[Verdict]]
#: Most paused runs one sweep reads; more are left to their facts and the next sweep.
SWEEP_LIMIT = 10_000


class ResumerReads(Protocol):
    """What the resumer reads of the ledger (a `LedgerStore` has it)."""

    async def get_call(self, key: str) -> CallRecord | None: ...

    async def get_run(self, run_id: str) -> RunRecord | None: ...

    async def list_runs(
        self, statuses: Collection[str], tenant_id: str | None = None, limit: int = 500
    ) -> list[RunRecord]: ...


def load_hook(spec: str) -> ResumeHook:
    """`package.module:function` -> the async resume hook it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModuleLoadError(f"--app {spec}: expected module:function, e.g. myapp.agents:resume")
    hook = getattr(import_user_module(module_name, "--app"), attr, None)
    if hook is None or not callable(hook):
        raise ModuleLoadError(f"--app {spec}: {module_name} has no callable {attr}")
    return hook  # type: ignore[no-any-return]


class Resumer:
    """Decides from facts and sweeps which paused runs may go on; knows nothing about faust.

    `on_fact` and `sweep` only take note (they never call the hook and never raise); `tick`,
    called every fraction of a second, starts the hooks and sweeps that are due.
    """

    def __init__(
        self,
        hook: ResumeHook,
        reads: ResumerReads,
        *,
        mark_failed: MarkFailed | None = None,
        policy: ResumePolicy | None = None,
        concurrency: int = 8,
    ) -> None:
        self.reads = reads
        self.tasks = ResumeTasks(
            hook, reads.get_run, mark_failed, policy or ResumePolicy(), concurrency
        )
        self._owns: Callable[[str], bool] = lambda run_id: True
        self._sweep_due: float | None = None
        self._sweep_failures = 0

    @property
    def resumed(self) -> int:
        """Hooks that returned."""
        return self.tasks.resumed

    @property
    def gave_up(self) -> int:
        """Pauses whose hook failed every attempt."""
        return self.tasks.gave_up

    async def on_fact(self, fact: Fact) -> bool:
        """Take note of `fact`; True when it made a run due for its hook."""
        verdict = fact.verdict
        run = verdict.run
        if not verdict.accepted or run is None:
            return False
        if run.status not in PAUSED:
            self.tasks.forget(run.run_id)  # it went on (resumed, finished): nothing to retry
            return False
        if verdict.event_type == "run_paused" and run.waiting_on:
            try:
                call = await self.reads.get_call(run.waiting_on)
            except Exception as exc:  # the sweep reads it again
                log.warning(
                    "run %s: could not read %s (%r); sweeping", run.run_id, run.waiting_on, exc
                )
                self.sweep_soon()
                return False
        elif verdict.call is not None and run.waiting_on == verdict.key:
            call = verdict.call
        else:
            return False
        return wait_is_over(run, call) and self.tasks.offer(run)

    def take_partitions(self, partitions: Collection[int], count: int) -> None:
        """This process now owns `partitions` of `count`: sweep their paused runs."""
        owned = frozenset(partitions)
        self._owns = lambda run_id: partition_for(run_id, count) in owned
        self.sweep_soon()

    def sweep_soon(self) -> None:
        """Sweep at the next tick (unless one is already due earlier)."""
        now = self.tasks.clock()
        if self._sweep_due is None or self._sweep_due > now:
            self._sweep_due = now

    async def sweep(self) -> int:
        """Offer every paused run whose wait is over and which this process owns; returns how
        many became due. Raises what the reads raise (`tick` retries with a back-off)."""
        offered = 0
        runs = await self.reads.list_runs(PAUSED, limit=SWEEP_LIMIT)
        if len(runs) >= SWEEP_LIMIT:
            log.warning("more than %d paused runs; the rest wait for the next sweep", SWEEP_LIMIT)
        for run in runs:
            if run.waiting_on is None or not self._owns(run.run_id) or self.tasks.holds(run):
                continue
            call = await self.reads.get_call(run.waiting_on)
            if wait_is_over(run, call) and self.tasks.offer(run):
                offered += 1
        if offered:
            log.info("%d paused run(s) whose wait is over are due for their resume hook", offered)
        return offered

    def tick(self) -> int:
        """Start the sweep and the hooks that are due; returns how many hooks started."""
        now = self.tasks.clock()
        if self._sweep_due is not None and self._sweep_due <= now:
            self._sweep_due = None
            self.tasks.spawn("sweep", self._sweep_once())
        return self.tasks.start_due()

    async def _sweep_once(self) -> None:
        try:
            await self.sweep()
            self._sweep_failures = 0
        except Exception as exc:
            self._sweep_failures += 1
            delay = self.tasks.policy.delay(self._sweep_failures)
            log.warning("could not sweep the paused runs (%r); again in %.1fs", exc, delay)
            self._sweep_due = self.tasks.clock() + delay

    def waiting(self) -> list[Wait]:
        """The pauses this process holds (for tests and status lines)."""
        return self.tasks.waiting()

    async def close(self) -> None:
        """Cancel the hooks and sweeps in flight (a resumer that starts sweeps them again)."""
        await self.tasks.close()


def resumer_app(
    settings: Settings,
    resumer: Resumer,
    *,
    partitions: int,
    group: str | None = None,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT_S,
    tick_every: float = 0.2,
) -> faust.App:
    """The faust app: one agent over the facts topic, and a timer that starts due hooks."""
    app = processor_app(
        settings, "resumer", partitions=partitions, group=group, session_timeout=session_timeout
    )
    facts_topic = settings.facts_topic
    facts = facts_topic_of(app, settings, partitions)
    owned: list[int] = []

    @app.agent(facts, name="resumer-facts")
    async def follow(stream: Any) -> None:
        async for value in stream:
            try:
                facts = facts_in(value)
            except ValueError:
                log.warning("a facts record is not a fact; skipped")
                continue
            for fact in facts:
                await resumer.on_fact(fact)

    async def tick() -> None:
        if app.rebalancing:
            return
        # The consumer's own assignment: faust's assignor records actives only for apps
        # with tables, and the resumer has none.
        mine = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == facts_topic)
        if mine != owned:
            owned[:] = mine
            log.info("owns facts partitions %s; sweeping their paused runs", mine)
            resumer.take_partitions(mine, partitions)
        resumer.tick()

    app.timer(tick_every, name="resumer-tick")(tick)
    return app
