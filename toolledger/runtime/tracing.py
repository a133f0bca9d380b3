"""The span of one `Ledger.call` and the timing of its phases: spans and Prometheus histograms.

A call is one `execute_tool {tool}` span (OpenTelemetry GenAI conventions), nested under
whatever span is current when `Ledger.call` is awaited (a framework's agent or tool span), with
a child span per phase a call can go through:

- `toolledger.reserve`: the reservation appended and its verdict awaited (the verdict wait);
- `toolledger.tool`: the tool itself, every attempt;
- `toolledger.outcome`: the outcome appended, and its verdict awaited when it is needed.

A replay answered from the ledger has no phase: the call span says `toolledger.replayed=true`.

Every phase is also observed in a histogram, labelled by tool and effect class only (bounded;
keys never become labels), whether or not anything records spans:
`toolledger_call_verdict_wait_seconds`, `toolledger_call_tool_seconds` and
`toolledger_call_outcome_seconds`. Buckets run from a millisecond (a memory ledger's verdict) to
a minute (a slow tool), like the operator API's verdict histogram.

The hot path is the no-op case (no SDK configured, the default): the call span is the API's
non-recording span, no attribute is computed, no child span is started and no context is
attached; what is left is one context lookup, two clock reads per phase and three histogram
observations (BENCHMARKS.md, "tracing overhead").
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from prometheus_client import Histogram

from toolledger import telemetry as names
from toolledger.errors import LedgerUnavailable
from toolledger.events.records import CallRecord, Verdict
from toolledger.runtime.executor import Attempted, Completed, Failed
from toolledger.runtime.outcome import ToolOutcome

#: Seconds, from a memory ledger's verdict to a slow tool.
PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
_LABELS = ["tool", "effect"]

VERDICT_WAIT_SECONDS = Histogram(
    "toolledger_call_verdict_wait_seconds",
    "Seconds from appending a call's reservation to its verdict (Ledger.call).",
    _LABELS,
    buckets=PHASE_BUCKETS,
)
TOOL_SECONDS = Histogram(
    "toolledger_call_tool_seconds",
    "Seconds the tool ran in a Ledger.call, every attempt included.",
    _LABELS,
    buckets=PHASE_BUCKETS,
)
OUTCOME_SECONDS = Histogram(
    "toolledger_call_outcome_seconds",
    "Seconds from appending a call's outcome to its acknowledgement or verdict (Ledger.call).",
    _LABELS,
    buckets=PHASE_BUCKETS,
)

RESERVE_SPAN = "toolledger.reserve"
TOOL_SPAN = "toolledger.tool"
OUTCOME_SPAN = "toolledger.outcome"

_PerTool = tuple[Any, Any, Any, str]
_per_tool: dict[tuple[str, str], _PerTool] = {}


def _of_tool(tool: str, effect: str) -> _PerTool:
    """A tool's three labelled histograms and its span name, made once per tool, not per call."""
    found = _per_tool.get((tool, effect))
    if found is None:
        found = _per_tool[(tool, effect)] = (
            VERDICT_WAIT_SECONDS.labels(tool, effect),
            TOOL_SECONDS.labels(tool, effect),
            OUTCOME_SECONDS.labels(tool, effect),
            f"execute_tool {tool}",
        )
    return found


class Phase:
    """One phase of a call: timed always, a child span only under a recording call span."""

    __slots__ = (
        "_call",
        "_histogram",
        "_name",
        "_observed",
        "_parent",
        "_started",
        "_token",
        "span",
    )

    def __init__(self, histogram: Any, name: str, call: Span) -> None:
        self._histogram = histogram
        self._name = name
        self._call = call
        self._parent = call if call.is_recording() else None
        self.span: Span | None = None
        self._token: object = None
        self._observed = True

    def __enter__(self) -> Phase:
        if self._parent is not None:
            parent = trace.set_span_in_context(self._parent)
            self.span = names.tracer().start_span(self._name, context=parent)
            self._token = otel_context.attach(trace.set_span_in_context(self.span))
        self._started = time.perf_counter()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if self._observed:
            self._histogram.observe(time.perf_counter() - self._started)
        if self.span is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            if exc is not None:
                _failed(self.span, exc)
            self.span.end()

    def unobserved(self) -> None:
        """This phase turned out not to be one (a reservation that found its key recorded
        and appended nothing): its time is not observed. Only under a non-recording call span,
        which is the only place a pipeline asks it (`CallPipeline`)."""
        assert self.span is None, "a recording phase's span cannot be taken back"
        self._observed = False

    def trace_context(self) -> tuple[str | None, str | None]:
        """What a reservation appended in this phase carries: this span's context, or the
        call's when nothing records here (a framework's trace still reaches the projector)."""
        return names.trace_context_of(self.span if self.span is not None else self._call)

    def verdict(self, verdict: Verdict) -> None:
        if self.span is not None:
            self.span.set_attribute(names.VERDICT, verdict.reason)

    def ended(self, ended: Attempted) -> None:
        """How the tool's run ended (on the tool span)."""
        if self.span is not None:
            self.span.set_attribute(names.ATTEMPT, ended.attempts)
            if not isinstance(ended, Completed):
                self.span.set_attribute(names.ERROR_TYPE, ended.error_type)
                self.span.set_status(Status(StatusCode.ERROR, ended.error))


class CallTrace:
    """The span of one call and the phases it went through, as a context manager.

    `Ledger.call` enters it around everything it does; `outcome()` notes what it returns. An
    exception leaving the block is recorded on the span (`error.type`, and whatever the error
    knows about the call's record).
    """

    __slots__ = ("_ended", "_histograms", "_token", "span")

    def __init__(self, tool: str, effect: str, run_id: str, tool_call_id: str, key: str) -> None:
        self._histograms = _of_tool(tool, effect)
        self._ended: Attempted | None = None
        self._token: object = None
        span = names.tracer().start_span(self._histograms[3])
        self.span = span
        if span.is_recording():
            span.set_attributes(
                {
                    names.GEN_AI_OPERATION_NAME: names.EXECUTE_TOOL,
                    names.GEN_AI_TOOL_NAME: tool,
                    names.GEN_AI_TOOL_TYPE: "function",
                    names.GEN_AI_TOOL_CALL_ID: tool_call_id,
                    names.GEN_AI_CONVERSATION_ID: run_id,
                    names.IDEMPOTENCY_KEY: key,
                    names.EFFECT: effect,
                }
            )

    def __enter__(self) -> CallTrace:
        if self.span.is_recording():
            self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(
        self, _t: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        span = self.span
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        if exc is not None and span.is_recording():
            _failed(span, exc)
            record = getattr(exc, "record", None)
            if isinstance(record, CallRecord):
                replayed = self._ended is None
                self._attributes(record.status, record.settled_by, record.not_attempted, replayed)
            if isinstance(exc, LedgerUnavailable):
                span.set_attribute(names.NOT_ATTEMPTED, True)
        span.end()

    @property
    def recording(self) -> bool:
        """Whether the call span records (an SDK is configured and samples it)."""
        return self.span.is_recording()

    def reserve(self) -> Phase:
        """The verdict wait: build the reservation inside it (`Phase.trace_context`)."""
        return Phase(self._histograms[0], RESERVE_SPAN, self.span)

    def tool(self) -> Phase:
        return Phase(self._histograms[1], TOOL_SPAN, self.span)

    def outcome_phase(self) -> Phase:
        return Phase(self._histograms[2], OUTCOME_SPAN, self.span)

    def ran(self, ended: Attempted) -> None:
        """The tool ran in this call and ended so (the call span's attempt and error type)."""
        self._ended = ended
        if self.span.is_recording():
            self.span.set_attribute(names.ATTEMPT, ended.attempts)

    def outcome(self, outcome: ToolOutcome[Any]) -> ToolOutcome[Any]:
        """Note the answer `Ledger.call` returns; returns it."""
        span = self.span
        if span.is_recording():
            self._attributes(
                outcome.status, outcome.settled_by, outcome.not_attempted, outcome.replayed
            )
            if outcome.status == "failed":
                ended = self._ended
                error_type = ended.error_type if isinstance(ended, Failed) else "ToolCallFailed"
                span.set_attribute(names.ERROR_TYPE, error_type)
                span.set_status(Status(StatusCode.ERROR, outcome.error))
        return outcome

    def _attributes(
        self, status: str, settled_by: str | None, not_attempted: bool, replayed: bool
    ) -> None:
        span = self.span
        span.set_attribute(names.STATUS, status)
        span.set_attribute(names.REPLAYED, replayed)
        span.set_attribute(names.NOT_ATTEMPTED, not_attempted)
        if settled_by is not None:
            span.set_attribute(names.SETTLED_BY, settled_by)


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute(names.ERROR_TYPE, type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(exc)))
