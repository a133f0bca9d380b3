"""The resumer: hands a paused run back to its host once the call it waits on is settled.

A run pauses (`awaiting_reconciliation`, `awaiting_approval`, `duplicate_intent`) waiting on
one call key. The resumer reads facts and notices two ways a wait can end:

- a call's fact, accepted, whose run record (carried in the verdict) is paused on that very key
  and whose new status ends the wait (settled; decided, for an approval);
- a `run_paused` fact whose awaited call was already settled when the pause landed (the call
  settled first): the call's record is read from the ledger.

It then awaits the host's hook, `async def resume(run: RunRecord) -> None`, inline: the fact's
offset is committed only after the hook returned, so a crash redelivers it (at least once; a
resumed run re-checkpoints, so a second resume of the same pause is fenced, not doubled).
Driving the run (model, tools) is the host's: typically `AgentRun(...).resume()`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from toolledger.events.records import CallRecord, RunRecord
from toolledger.extras import MissingExtra
from toolledger.modules import ModuleLoadError, import_user_module
from toolledger.processors.app import DEFAULT_SESSION_TIMEOUT_S, processor_app
from toolledger.processors.app import facts_topic as facts_topic_of
from toolledger.projections.facts import Fact, facts_in
from toolledger.runtime.pauses import PAUSED, wait_is_over
from toolledger.settings import Settings

try:
    import faust
except ImportError as exc:  # a runtime-only install: say which extra
    raise MissingExtra("server", "faust", "the resumer (a faust processor)") from exc

log = logging.getLogger("toolledger.resumer")

ResumeHook = Callable[[RunRecord], Awaitable[None]]
ReadCall = Callable[[str], Awaitable[CallRecord | None]]


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
    """Decides from facts which paused runs may go on; knows nothing about faust."""

    def __init__(self, hook: ResumeHook, read_call: ReadCall) -> None:
        self.hook = hook
        self.read_call = read_call
        self.resumed = 0
        self._done: set[tuple[str, str | None, object]] = set()

    async def on_fact(self, fact: Fact) -> bool:
        """Resume the run this fact ends the wait of, if any; True when the hook ran."""
        verdict = fact.verdict
        run = verdict.run
        if not verdict.accepted or run is None or run.status not in PAUSED:
            return False
        if verdict.event_type == "run_paused":
            call = await self.read_call(run.waiting_on) if run.waiting_on else None
        elif verdict.call is not None and run.waiting_on == verdict.key:
            call = verdict.call
        else:
            return False
        mark = (run.run_id, run.waiting_on, run.updated_at)
        if mark in self._done or not wait_is_over(run, call):
            return False
        log.info("run %s may go on (%s settled); resuming", run.run_id, run.waiting_on)
        await self.hook(run)
        self._done.add(mark)
        self.resumed += 1
        return True


def resumer_app(
    settings: Settings,
    resumer: Resumer,
    *,
    partitions: int,
    group: str | None = None,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT_S,
) -> faust.App:
    """The faust app: one agent over the facts topic."""
    app = processor_app(
        settings, "resumer", partitions=partitions, group=group, session_timeout=session_timeout
    )
    facts = facts_topic_of(app, settings, partitions)

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

    return app
