"""Analytics: calls by tenant, tool and status, and per-minute rates of unknown and undone calls.

A faust app over the facts topic, exported as Prometheus metrics by its entry point
(`toolledger analytics --metrics-port 9464`). Tables are keyed by the facts partition first
(`<partition>|<tenant>|<tool>|...`): a faust table change goes to the changelog partition of
the event being processed, so a key written from one partition only is recovered exactly, with
no repartition topic. Each process therefore exports the share of its own partitions, and a
Prometheus `sum by (tenant, tool, status)` gives the whole.

- `toolledger_calls{tenant,tool,status}`: calls whose record is now in each status (a call moves
  between statuses: the previous status of each key is kept in a table too);
- `toolledger_indeterminate_per_minute{tenant,tool}` and `toolledger_compensated_per_minute`:
  calls that became indeterminate / compensated in the current one-minute window (tumbling, by
  the request's `occurred_at`; the last ten windows of each series are kept).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from toolledger.extras import MissingExtra
from toolledger.processors.app import DEFAULT_SESSION_TIMEOUT_S, processor_app
from toolledger.processors.app import facts_topic as facts_topic_of
from toolledger.projections.facts import Fact, facts_in
from toolledger.settings import Settings

try:
    import faust
except ImportError as exc:  # a runtime-only install: say which extra
    raise MissingExtra("server", "faust", "analytics (a faust processor)") from exc

log = logging.getLogger("toolledger.analytics")

WINDOW_S = 60.0
_RATED = {"indeterminate": "indeterminate_per_minute", "compensated": "compensated_per_minute"}


def status_change(fact: Fact, previous: str | None) -> tuple[str | None, str] | None:
    """(old status, new status) when an accepted fact moved a call's record; else None."""
    call = fact.verdict.call
    if not fact.verdict.accepted or call is None or call.status == previous:
        return None
    return previous, call.status


class Metrics:
    """The Prometheus gauges, refreshed from the tables (library code only holds the objects)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.calls = Gauge(
            "toolledger_calls",
            "Calls whose ledger record is now in each status.",
            ["tenant", "tool", "status"],
            registry=self.registry,
        )
        self.rates = {
            status: Gauge(
                f"toolledger_{name}",
                f"Calls that became {status} in the current one-minute window.",
                ["tenant", "tool"],
                registry=self.registry,
            )
            for status, name in _RATED.items()
        }

    def refresh(
        self,
        counts: dict[tuple[str, str, str], int],
        rates: dict[str, dict[tuple[str, str], int]],
    ) -> None:
        self.calls.clear()
        for (tenant, tool, status), n in counts.items():
            self.calls.labels(tenant, tool, status).set(n)
        for status, gauge in self.rates.items():
            gauge.clear()
            for (tenant, tool), n in rates.get(status, {}).items():
                gauge.labels(tenant, tool).set(n)


def analytics_app(
    settings: Settings,
    metrics: Metrics,
    *,
    partitions: int,
    group: str | None = None,
    session_timeout: float = DEFAULT_SESSION_TIMEOUT_S,
    refresh_every: float = 1.0,
) -> faust.App:
    app = processor_app(
        settings, "analytics", partitions=partitions, group=group, session_timeout=session_timeout
    )
    facts = facts_topic_of(app, settings, partitions)
    status_of = app.Table("status-of", default=None, partitions=partitions, key_type=str)
    counts = app.Table("calls-by-status", default=int, partitions=partitions, key_type=str)
    # Tumbling one-minute windows by the request's own time, as plain keys
    # `<partition>|<tenant>|<tool>|<status>|<minute>`; faust's windowed tables cannot be listed
    # from a timer without an extra key-index table, and these are few.
    per_minute = app.Table("per-minute", default=int, partitions=partitions, key_type=str)
    recent: dict[str, list[str]] = defaultdict(list)

    @app.agent(facts, name="analytics-facts")
    async def count(stream: Any) -> None:
        async for event in stream.events():
            try:
                facts = facts_in(event.value)
            except ValueError:
                continue
            for fact in facts:
                tally(fact, event.message.partition)

    def tally(fact: Fact, partition: int) -> None:
        """Count one fact read from `partition` (a record may pack several)."""
        call = fact.verdict.call
        if call is None:
            return
        change = status_change(fact, status_of.get(call.key))
        if change is None:
            return
        old, new = change
        base = f"{partition}|{call.tenant_id}|{call.tool}"
        if old is not None:
            counts[f"{base}|{old}"] -= 1
        counts[f"{base}|{new}"] += 1
        status_of[call.key] = new
        if new in _RATED:
            minute = int(fact.occurred_at.timestamp() // WINDOW_S)
            key = f"{base}|{new}|{minute}"
            per_minute[key] += 1
            keys = recent[f"{base}|{new}"]
            if key not in keys:
                keys.append(key)
            while len(keys) > 10:  # keep ten windows per series
                per_minute.pop(keys.pop(0), None)

    async def refresh() -> None:
        totals: dict[tuple[str, str, str], int] = defaultdict(int)
        for key, n in list(counts.items()):
            _, tenant, tool, status = key.split("|", 3)
            totals[(tenant, tool, status)] += int(n)
        rates: dict[str, dict[tuple[str, str], int]] = {s: defaultdict(int) for s in _RATED}
        current = int(time.time() // WINDOW_S)
        for key, n in list(per_minute.items()):
            _, tenant, tool, status, minute = key.split("|", 4)
            if int(minute) == current:
                rates[status][(tenant, tool)] += int(n)
        metrics.refresh({k: v for k, v in totals.items() if v}, rates)

    app.timer(refresh_every, name="analytics-refresh")(refresh)
    return app
