"""The operator API's Prometheus metrics: plain `prometheus_client` objects, nothing else.

Library code (the service layer) only observes these; the `/metrics` route of the app is the
entry point that refreshes the ledger-wide gauges and exposes the default registry
(observability is configured at the edges). They live in the default registry because a process
serves one API; tests that build several apps share them, which is harmless for counters and
histograms and means the gauges show whichever app refreshed last.

- `toolledger_ledger_calls{status}`: calls in the ledger per status, every tenant, read from
  PostgreSQL (the analytics app's `toolledger_calls` splits them by tenant and tool from facts).
- `toolledger_unsettled_calls{status, older_than_seconds}`: `started` and `indeterminate` calls
  whose record has not changed for at least that long, cumulative: alert on
  `toolledger_unsettled_calls{status="indeterminate", older_than_seconds="3600"} > 0`.
- `toolledger_runs_resume_failed`: paused runs whose resume hook failed every try (the
  resumer's `run_resume_failed`), every tenant; alert on `> 0`, and list them with
  `GET /v1/runs?resume_failed=true`.
- `toolledger_api_verdict_seconds{command}`: from appending an operator command to its verdict,
  the latency an operator waits on (buckets in milliseconds to tens of seconds).
- `toolledger_api_commands_total{command, verdict}`: accepted, the decider's rejection reason,
  or `unavailable` when no verdict came in time.
- `toolledger_projector_lag_seconds`: how long the oldest operator command of this process has
  been waiting for its verdict (0 when none waits): the projector's delay as this API sees it,
  measured without trusting a broker's end offsets.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

#: Age bounds (seconds) of `toolledger_unsettled_calls`: 0, a minute, 5 minutes, an hour, a day.
UNSETTLED_AGES: tuple[float, ...] = (0.0, 60.0, 300.0, 3600.0, 86400.0)

CALLS = Gauge(
    "toolledger_ledger_calls", "Calls in the ledger per status (every tenant).", ["status"]
)
UNSETTLED = Gauge(
    "toolledger_unsettled_calls",
    "Started or indeterminate calls unchanged for at least older_than_seconds (cumulative).",
    ["status", "older_than_seconds"],
)
RESUME_FAILED = Gauge(
    "toolledger_runs_resume_failed",
    "Paused runs whose resume hook failed every try and that have not moved on since.",
)
VERDICT_SECONDS = Histogram(
    "toolledger_api_verdict_seconds",
    "Seconds from appending an operator command to its durable verdict.",
    ["command"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
COMMANDS = Counter(
    "toolledger_api_commands",
    "Operator commands by verdict (accepted, a rejection reason, or unavailable).",
    ["command", "verdict"],
)
PROJECTOR_LAG = Gauge(
    "toolledger_projector_lag_seconds",
    "How long the oldest operator command of this process has waited for its verdict.",
)
