"""The projector's spans: one per applied batch, and one per traced reservation in it.

The projector applies a partition's fetched records in one transaction, so the unit of work a
span can honestly time is the batch: `process <topic>` (kind CONSUMER, the OpenTelemetry
messaging conventions for batch processing), with a link to the trace context of every
reservation in it that carries one. A link alone would leave the apply outside the call's trace,
which is where someone looking at a slow call looks, so each such reservation also gets a span
of its own, `toolledger.apply call_reserved`, whose parent is the context the reservation
carries (the runtime's `toolledger.reserve` span) and which links back to the batch. It starts
and ends with the batch's transaction: the verdict became durable when the batch committed.

Only batches holding a reservation that carries a trace context get spans: the others belong to
no call's trace, and a root trace per batch would bury the ones people look for (the projector's
own throughput and lag are metrics). Cost, the projector's hot path: with no tracer provider
configured a batch costs one check of the global provider and no event is looked at; with one,
the batch's events are scanned for a `traceparent`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from toolledger import telemetry as names
from toolledger.events.fold import DeadLetter, Positioned
from toolledger.events.models import CallReserved
from toolledger.events.records import Verdict

APPLY_SPAN = "toolledger.apply call_reserved"


class BatchSpans:
    """The spans of one batch's transaction, as a context manager around `apply_batch`."""

    __slots__ = ("_items", "_partition", "_reservations", "_topic", "span")

    span: Span | None

    def __init__(self, topic: str, partition: int, items: Sequence[Positioned | DeadLetter]):
        self._topic = topic
        self._partition = partition
        self._items = items
        self._reservations: list[tuple[CallReserved, Span]] = []

    def __enter__(self) -> BatchSpans:
        self.span = None
        if not names.tracing_enabled():
            return self
        traced = [
            (item.offset, event, parent)
            for item in self._items
            if isinstance(item, Positioned)
            and isinstance(event := item.event, CallReserved)
            and (parent := names.remote_context(event.traceparent, event.tracestate)) is not None
        ]
        if not traced:
            return self
        started = time.time_ns()
        tracer = names.tracer()
        self.span = span = tracer.start_span(
            f"process {self._topic}",
            kind=SpanKind.CONSUMER,
            start_time=started,
            links=[Link(ctx) for _, _, p in traced if (ctx := names.remote_span_context(p))],
        )
        span.set_attributes(
            {
                names.MESSAGING_SYSTEM: "kafka",
                names.MESSAGING_OPERATION_TYPE: "process",
                names.MESSAGING_DESTINATION: self._topic,
                names.MESSAGING_PARTITION: str(self._partition),
                names.MESSAGING_BATCH_COUNT: len(self._items),
            }
        )
        batch = [Link(span.get_span_context())]
        for offset, event, parent in traced:
            applying = tracer.start_span(
                APPLY_SPAN,
                context=parent,
                kind=SpanKind.CONSUMER,
                links=batch,
                start_time=started,
                attributes={
                    names.MESSAGING_SYSTEM: "kafka",
                    names.MESSAGING_OPERATION_TYPE: "process",
                    names.MESSAGING_DESTINATION: self._topic,
                    names.MESSAGING_PARTITION: str(self._partition),
                    names.MESSAGING_OFFSET: offset,
                    names.IDEMPOTENCY_KEY: event.key,
                    names.GEN_AI_TOOL_NAME: event.tool,
                    names.RESERVATION_ID: str(event.reservation_id),
                },
            )
            self._reservations.append((event, applying))
        return self

    def applied(self, verdicts: Sequence[Verdict]) -> None:
        """The batch's verdicts: each reservation's span says what the decider made of it."""
        if not self._reservations:
            return
        by_event = {v.event_id: v for v in verdicts}
        for event, applying in self._reservations:
            verdict = by_event.get(event.event_id)
            if verdict is not None:  # None: applied before (a resend), so not decided again
                applying.set_attribute(names.VERDICT, verdict.reason)

    def __exit__(
        self, _t: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        for _, applying in self._reservations:
            if exc is not None:
                applying.set_status(Status(StatusCode.ERROR, str(exc)))
                applying.set_attribute(names.ERROR_TYPE, type(exc).__qualname__)
            applying.end()
        if self.span is None:
            return
        if exc is not None:
            self.span.record_exception(exc)
            self.span.set_attribute(names.ERROR_TYPE, type(exc).__qualname__)
            self.span.set_status(Status(StatusCode.ERROR, str(exc)))
        self.span.end()
