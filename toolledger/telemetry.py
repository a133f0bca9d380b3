"""The names toolledger's spans use, its tracer, and the trace context a reservation carries.

Library code only speaks `opentelemetry-api` (docs/tracing.md): without an SDK configured every
span here is the API's non-recording span and costs a context lookup; the entry points (the
`toolledger` CLI, or the program embedding a `Ledger`) decide whether and where spans go.

The attribute names are constants of our own rather than imports from
`opentelemetry-semantic-conventions`: that package marks the GenAI names as moved between
releases, and a rename there must not silently rename what dashboards query here. The `gen_ai.*`
and `error.type` names follow the OpenTelemetry GenAI conventions for tool execution; the
`toolledger.*` ones are ours (docs/tracing.md lists them all).

Keys, run ids and reservation ids are high-cardinality: they go on spans, never on metric labels.

A reservation carries the W3C `traceparent`/`tracestate` of the span that appended it
(`CallReserved` schema v3), so a process that acts on the call later, the projector applying the
reservation or a reconciler asking a hook about it, can start its span in the call's trace.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: The instrumentation scope every toolledger span is created under.
SCOPE = "toolledger"

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
ERROR_TYPE = "error.type"
#: The value of `gen_ai.operation.name` on a call's span.
EXECUTE_TOOL = "execute_tool"

IDEMPOTENCY_KEY = "toolledger.idempotency_key"
STATUS = "toolledger.status"
REPLAYED = "toolledger.replayed"
ATTEMPT = "toolledger.attempt"
NOT_ATTEMPTED = "toolledger.not_attempted"
SETTLED_BY = "toolledger.settled_by"
EFFECT = "toolledger.effect"
TENANT_ID = "toolledger.tenant_id"
RESERVATION_ID = "toolledger.reservation_id"
#: `accepted`, or the decider's reason for rejecting the event (`held`, `late_outcome`, ...).
VERDICT = "toolledger.verdict"
#: What a reconcile hook found: `completed`, `failed` or `unknown`.
FINDING = "toolledger.finding"

MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_DESTINATION = "messaging.destination.name"
MESSAGING_PARTITION = "messaging.destination.partition.id"
MESSAGING_OFFSET = "messaging.kafka.offset"
MESSAGING_BATCH_COUNT = "messaging.batch.message_count"

_W3C = TraceContextTextMapPropagator()


def tracer() -> trace.Tracer:
    """toolledger's tracer, from whatever provider is global when a span starts.

    A proxy: a provider set after import (the usual order in a program) is picked up.
    """
    return _TRACER


_TRACER = trace.get_tracer(SCOPE)


def tracing_enabled() -> bool:
    """Whether a tracer provider other than the API's default is installed.

    Asking the API reads the environment (`OTEL_PYTHON_TRACER_PROVIDER`) while no provider is
    set, which costs more than a non-recording span, so the answer is cached: a provider, once
    set, stays (the API sets it once per process); its absence is checked again each second, so
    a program that configures tracing after the projector started is seen within a second.
    """
    global _enabled, _checked_at
    if _enabled:
        return True
    now = time.monotonic()
    if now - _checked_at < _RECHECK_S:
        return False
    _checked_at = now
    provider = trace.get_tracer_provider()
    _enabled = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return _enabled


_RECHECK_S = 1.0
_enabled = False
_checked_at = -_RECHECK_S


def trace_context_of(span: Span) -> tuple[str | None, str | None]:
    """The W3C `traceparent` and `tracestate` of `span`, or `(None, None)` outside any trace."""
    context = span.get_span_context()
    if not context.is_valid:
        return None, None
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    return traceparent, (context.trace_state.to_header() or None)


def remote_context(traceparent: str | None, tracestate: str | None) -> Context | None:
    """The context a span started from a carried `traceparent` takes as parent; None when the
    event carries none, or one that is not valid W3C (an old writer, a hand-made event)."""
    if traceparent is None:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _W3C.extract(carrier)
    return context if remote_span_context(context) is not None else None


def remote_span_context(context: Context) -> SpanContext | None:
    """The span context `remote_context` extracted (for a link), or None if it is not valid."""
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None
