"""The reconcile driver: asks tools' reconcile hooks about unknown calls and records what they find.

A call whose outcome nobody knows (`indeterminate`, or `started` past its lease) is settled only
on evidence (guarantee 6). This processor gathers the evidence continuously:

1. A faust agent folds the facts topic into a table of unsettled calls per run
   (`toolledger.processors.unsettled`). The table is changelog-backed, so a restarted reconciler,
   or another one taking a partition over, recovers it from Kafka.
2. A timer scans the table entries of the partitions this process owns and, for each call that
   is due (`toolledger.processors.schedule`) and still at that version in the ledger (one point
   read, because the table can lag a few facts behind after a restart), asks the tool's
   reconcile hook.
3. The answer becomes a finding (`toolledger.runtime.reconcile`, the rule a replaying runtime
   applies too: `CallCompleted` or `CallFailed` with source `reconcile`, or
   `ReconcileAttempted`), settled through the call protocol (`CallProtocol.settle`, a bounded
   `CallWaits`) like any other request, carrying the reservation and the record version the
   reconciler saw. No verdict in time (`LedgerUnavailable`): the call is asked again later.

A tool whose downstream replays its first answer for a repeated key
(`external(replays_key_for=...)`) has no hook: its due calls are resent with the same key
instead, each resend ledgered as a reconcile attempt with its evidence
(`toolledger.runtime.resend`). Past the window a resend could act twice, so such a call is left
to an operator, and the log says why once.

Correctness does not rest on this process. The decider accepts a finding only for the current
reservation at the expected version, so two reconcilers (a rebalance, a misconfigured second
group), a finding that lands after an operator resolved the call, or one that lands after the
runtime reserved the key again, are rejected and kept in the key's history as evidence. The
in-memory bookkeeping below (which (key, version) pairs were already asked) only saves work: one
question per record version per process.

Each question is a `toolledger.reconcile` span. Given `read_history` (the CLI passes it when a
tracer provider is configured), the span joins the call's trace: its parent is the trace context
the call's reservation carried (docs/tracing.md); without it the span starts a trace of its own.

Timers must not write faust tables (a table write needs the event being processed, for its
partition), so the timer only reads the table; the table changes when the finding's fact comes
back through the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from opentelemetry.context import Context
from prometheus_client import Counter

from toolledger import telemetry as names
from toolledger.errors import LedgerUnavailable
from toolledger.events.fold import HistoryEntry
from toolledger.events.lifecycle import may_still_run
from toolledger.events.models import utcnow
from toolledger.events.records import CallRecord, Verdict
from toolledger.extras import MissingExtra
from toolledger.modules import ModuleLoadError, import_user_module
from toolledger.port import RuntimePort
from toolledger.processors.app import DEFAULT_SESSION_TIMEOUT_S, processor_app
from toolledger.processors.app import facts_topic as facts_topic_of
from toolledger.processors.schedule import ReconcilePolicy, exhausted, is_due
from toolledger.processors.unsettled import UnsettledRun, fold_fact, parse_facts
from toolledger.projections.facts import Fact
from toolledger.runtime.protocol import CallProtocol, CallWaits
from toolledger.runtime.reconcile import ask_hook, finding_for
from toolledger.runtime.resend import past_window, settle_by_resend, window_passed
from toolledger.runtime.tools import Tool, Toolset
from toolledger.settings import Settings

try:
    import faust
except ImportError as exc:  # a runtime-only install: say which extra
    raise MissingExtra("server", "faust", "the reconciler (a faust processor)") from exc

log = logging.getLogger("toolledger.reconciler")

FINDINGS = Counter(
    "toolledger_reconcile_findings",
    "Reconcile findings appended, by tool, finding and verdict (accepted or the reason).",
    ["tool", "finding", "verdict"],
)

AnyTool = Tool[Any, Any]
#: A compensation call is keyed `<run_id>:<tool_call_id>:compensate`.
COMPENSATE_SUFFIX = ":compensate"
RECONCILE_SPAN = "toolledger.reconcile"


def collect_tools(modules: Iterable[str]) -> dict[str, AnyTool]:
    """Every `Tool` in the named modules, by full name: module attributes that are tools, and
    the tools of module attributes that are `Toolset`s."""
    tools: dict[str, AnyTool] = {}
    for name in modules:
        module = import_user_module(name, "--tools")
        declared = [
            tool
            for value in list(vars(module).values())
            for tool in (list(value) if isinstance(value, Toolset) else [value])
            if isinstance(tool, Tool)
        ]
        if not declared:
            raise ModuleLoadError(f"--tools {name} declares no Toolset or Tool at its top level")
        for tool in declared:
            if tools.setdefault(tool.name, tool) is not tool:
                raise ModuleLoadError(
                    f"two different tools are named {tool.name} (one in {name}); tool names "
                    "must be unique, or the reconciler cannot tell whose hook to ask"
                )
    return tools


class Reconciler:
    """Asks hooks about due calls and appends their findings; knows nothing about faust.

    `scan(records)` is called with the current table contents of the partitions this process
    owns; it starts at most `concurrency` questions at a time, one per (key, version).
    """

    def __init__(
        self,
        tools: Mapping[str, AnyTool],
        port: RuntimePort,
        *,
        policy: ReconcilePolicy | None = None,
        policies: Mapping[str, ReconcilePolicy] | None = None,
        read_call: Callable[[str], Awaitable[CallRecord | None]] | None = None,
        read_history: Callable[[str], Awaitable[list[HistoryEntry]]] | None = None,
        verdict_timeout: float = 10.0,
        retry_after: float = 1.0,
        concurrency: int = 16,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.tools = dict(tools)
        self.port = port
        self.protocol = CallProtocol(port, CallWaits.request(verdict_timeout), clock=clock)
        self.read_call = read_call
        self.read_history = read_history
        self.policy = policy or ReconcilePolicy()
        self.policies = dict(policies or {})
        self.retry_after = retry_after
        self.concurrency = concurrency
        self.clock = clock
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._asked: set[tuple[str, int]] = set()
        self._retry_at: dict[tuple[str, int], float] = {}
        self._exhausted: set[tuple[str, int]] = set()
        self._told: set[str] = set()

    def policy_for(self, tool: str) -> ReconcilePolicy:
        return self.policies.get(tool, self.policy)

    def scan(self, records: Iterable[CallRecord]) -> int:
        """Start questions for the due records; returns how many were started."""
        now = self.clock()
        seen: set[tuple[str, int]] = set()
        started = 0
        # By key, not by version: an attempt in flight moves its own call to a new version (its
        # `reconcile_attempted`), which must not start a second question while the first still
        # records what it found (a second resend of a refund came 1 s after the first).
        asking = {key for key, _ in self._running}
        for record in records:
            mark = (record.key, record.version)
            seen.add(mark)
            if mark in self._asked or record.key in asking:
                continue
            if self._retry_at.get(mark, 0.0) > time.monotonic():
                continue
            tool = self._hooked_tool(record)
            if tool is None:
                continue
            policy = self.policy_for(tool.name)
            if not is_due(record, policy, now):
                if exhausted(record, policy) and mark not in self._exhausted:
                    self._exhausted.add(mark)
                    log.warning(
                        "call %s (run %s, call %s) is still %s after %d reconcile attempts; an "
                        "operator must settle it: `toolledger executions resolve %s --outcome "
                        "completed|failed --reason ...`",
                        tool.name,
                        record.run_id,
                        record.tool_call_id,
                        record.status,
                        record.reconcile_attempts,
                        shlex.quote(record.key),
                    )
                continue
            if len(self._running) >= self.concurrency:
                continue  # not `break`: every record must reach `seen` below
            self._running[mark] = asyncio.create_task(
                self._attempt(record, tool), name=f"reconcile {record.key} v{record.version}"
            )
            asking.add(record.key)
            started += 1
        # Forget versions that are gone from the table: the fact of their finding has arrived.
        self._asked &= seen
        self._exhausted &= seen
        self._retry_at = {m: t for m, t in self._retry_at.items() if m in seen}
        return started

    @property
    def busy(self) -> int:
        """Questions in flight."""
        return len(self._running)

    async def close(self) -> None:
        """Cancel the questions in flight (a finding not appended yet is asked again later)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _attempt(self, record: CallRecord, tool: AnyTool) -> None:
        mark = (record.key, record.version)
        try:
            if not await self._still_current(record):
                self._asked.add(mark)  # the table lags the ledger; wait for it to catch up
                return
            # The hook reads the arguments: restore them if they travel by reference.
            record = await self.port.restored_call(record)
            parent = await self._reservation_context(record)
            with names.tracer().start_as_current_span(
                RECONCILE_SPAN, context=parent, attributes=_attempt_attributes(record, tool)
            ) as span:
                finding = "reconcile_attempted"
                try:
                    if tool.resends:
                        resent = await settle_by_resend(self.protocol, tool, record)
                        span.set_attribute(names.FINDING, resent.found.status)
                        verdict = resent.verdict
                        finding = verdict.event_type
                    else:
                        found = await ask_hook(tool, record, self.clock())
                        span.set_attribute(names.FINDING, found.status)
                        asked = finding_for(record, tool, found, self.clock())
                        finding = asked.type
                        verdict = await self.protocol.settle(asked)
                except LedgerUnavailable as exc:
                    FINDINGS.labels(tool.name, finding, "unavailable").inc()
                    span.set_attribute(names.VERDICT, "unavailable")
                    log.warning(
                        "finding for %s not recorded (%s); asking again later", record.key, exc
                    )
                    self._retry_at[mark] = time.monotonic() + self.retry_after
                    return
                span.set_attribute(names.VERDICT, verdict.reason)
            self._asked.add(mark)
            self._report(tool, finding, verdict)
        except Exception:
            log.exception("reconciling %s failed; asking again later", record.key)
            self._retry_at[mark] = time.monotonic() + self.retry_after
        finally:
            self._running.pop(mark, None)

    async def _reservation_context(self, record: CallRecord) -> Context | None:
        """The trace context `record`'s reservation carried, from the key's history."""
        if self.read_history is None:
            return None
        for entry in reversed(await self.read_history(record.key)):
            if entry.event_type == "call_reserved" and entry.accepted:
                reserved = json.loads(entry.event_json)
                if reserved.get("reservation_id") == str(record.reservation_id):
                    return names.remote_context(
                        reserved.get("traceparent"), reserved.get("tracestate")
                    )
        return None

    async def _still_current(self, record: CallRecord) -> bool:
        """Whether the ledger still holds `record`'s version.

        The table is as fresh as the facts this process has folded; right after a restart or a
        rebalance it can be a few facts behind. One point read keeps the questions to calls
        that are really unknown now, so a call settled meanwhile does not collect a rejected
        finding in its history (which would be harmless, but noise for the people reading it).
        """
        if self.read_call is None:
            return True
        current = await self.read_call(record.key)
        if current is not None and current.version == record.version:
            return True
        log.debug("%s moved on to version %s; not asked", record.key, current and current.version)
        return False

    def _report(self, tool: AnyTool, finding: str, verdict: Verdict) -> None:
        FINDINGS.labels(tool.name, finding, verdict.reason).inc()
        if verdict.accepted:
            log.info("%s: %s (%s)", verdict.key, finding, verdict.detail)
        else:
            log.info(
                "%s: %s not applied, %s: %s",
                verdict.key,
                finding,
                verdict.reason,
                verdict.detail,
            )

    def _hooked_tool(self, record: CallRecord) -> AnyTool | None:
        """The tool whose hook can settle `record`, or None (said once per tool or key)."""
        if record.tool_call_id.endswith(COMPENSATE_SUFFIX):
            # Compensation calls (tool `<tool>:compensate`) have no reconcile hook: the operator
            # who asked for one settles it if it becomes unknown (toolledger.api.compensation).
            self._tell_once(
                f"compensation:{record.key}",
                logging.INFO,
                "compensation call %s is %s; compensations are settled by an operator",
                record.key,
                record.status,
            )
            return None
        tool = self.tools.get(record.tool)
        if tool is None:
            self._tell_once(
                f"unknown:{record.tool}",
                logging.WARNING,
                "unsettled calls of tool %s (first: %s) are not reconciled: no module given "
                "with --tools declares it; they wait for an operator",
                record.tool,
                record.key,
            )
            return None
        if tool.resends:
            if may_still_run(record, self.clock()):
                return None  # a resend never races the runtime still waiting for its answer
            if past_window(record, tool, self.clock()):
                self._tell_once(
                    f"window:{record.key}", logging.WARNING, "%s", window_passed(record, tool)
                )
                return None
            return tool
        if tool.reconcile is None:
            self._tell_once(
                f"nohook:{tool.name}",
                logging.INFO,
                "tool %s has no reconcile hook; its unknown calls (first: %s) wait for an operator",
                tool.name,
                record.key,
            )
            return None
        return tool

    def _tell_once(self, topic: str, level: int, message: str, *args: object) -> None:
        if topic not in self._told:
            self._told.add(topic)
            log.log(level, message, *args)


def _attempt_attributes(record: CallRecord, tool: AnyTool) -> dict[str, str | int]:
    return {
        names.GEN_AI_TOOL_NAME: tool.name,
        names.GEN_AI_TOOL_CALL_ID: record.tool_call_id,
        names.GEN_AI_CONVERSATION_ID: record.run_id,
        names.IDEMPOTENCY_KEY: record.key,
        names.RESERVATION_ID: str(record.reservation_id),
        names.STATUS: record.status,
        names.ATTEMPT: record.reconcile_attempts + 1,
    }


def reconciler_app(
    settings: Settings,
    reconciler: Reconciler,
    *,
    partitions: int,
    group: str | None = None,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT_S,
    scan_every: float = 0.5,
) -> faust.App:
    """The faust app: the facts agent, the unsettled-calls table and the scanning timer."""
    app = processor_app(
        settings, "reconciler", partitions=partitions, group=group, session_timeout=session_timeout
    )
    facts_topic = settings.facts_topic
    facts = facts_topic_of(app, settings, partitions)
    table = app.Table("unsettled", default=None, partitions=partitions, key_type=str)
    parsed = _ParsedEntries()
    owned: list[int] = []

    @app.agent(facts, name="reconciler-facts")
    async def fold(stream: Any) -> None:
        async for event in stream.events():
            facts = parse_facts(event.value)
            if facts is None:
                log.warning(
                    "facts record at %s[%d]@%d is not a fact; skipped",
                    facts_topic,
                    event.message.partition,
                    event.message.offset,
                )
                continue
            for fact in facts:
                remember(fact, event.message.partition)

    def remember(fact: Fact, partition: int) -> None:
        """Fold one fact (a record may pack several) into its run's unsettled calls."""
        run_id = fact.verdict.run_id
        raw = table.get(run_id)
        entry = parsed.get(run_id, raw)
        new = fold_fact(entry, fact, partition)
        if new is entry:
            return
        if new is None:
            del table[run_id]
        else:
            value = new.model_dump(mode="json")
            table[run_id] = value
            parsed.put(run_id, value, new)

    async def scan() -> None:
        if app.rebalancing or app.in_recovery:
            return
        mine = sorted(
            tp.partition for tp in app.assignor.assigned_actives() if tp.topic == facts_topic
        )
        entries = [(run_id, parsed.get(run_id, raw)) for run_id, raw in list(table.items())]
        if mine != owned:
            owned[:] = mine
            log.info("owns facts partitions %s (%d runs with unsettled calls)", mine, len(entries))
        parsed.keep({run_id for run_id, _ in entries})
        records = [
            record
            for _, entry in entries
            if entry is not None and entry.partition in mine
            for record in entry.calls.values()
        ]
        reconciler.scan(records)

    app.timer(scan_every, name="reconciler-scan")(scan)
    return app


class _ParsedEntries:
    """Table values parsed once: the memory store hands back the same dict until it changes."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[object, UnsettledRun]] = {}

    def get(self, run_id: str, raw: object) -> UnsettledRun | None:
        if raw is None:
            self._cache.pop(run_id, None)
            return None
        cached = self._cache.get(run_id)
        if cached is not None and cached[0] is raw:
            return cached[1]
        entry = UnsettledRun.model_validate(raw)
        self._cache[run_id] = (raw, entry)
        return entry

    def put(self, run_id: str, raw: object, entry: UnsettledRun) -> None:
        self._cache[run_id] = (raw, entry)

    def keep(self, run_ids: set[str]) -> None:
        for run_id in set(self._cache) - run_ids:
            del self._cache[run_id]
