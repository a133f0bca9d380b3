"""The OpenTelemetry SDK for tests: an in-memory exporter per test, with the real global API.

OpenTelemetry's global tracer provider can be set once per process, and the library's tracer is
a proxy that binds to it on first use. So the suite installs one provider for the whole session,
`_Switch`, which hands out the current test's SDK tracer while a test listens (the `spans`
fixture) and the API's no-op tracer otherwise. Tests that do not ask for spans therefore run
exactly as without an SDK: non-recording spans, and no trace context in their events.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _SwitchTracer(trace.Tracer):
    def __init__(self, switch: _Switch, name: str) -> None:
        self._switch = switch
        self._name = name

    def _tracer(self) -> trace.Tracer:
        current = self._switch.current
        return current.get_tracer(self._name) if current is not None else trace.NoOpTracer()

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._tracer().start_span(*args, **kwargs)

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> Iterator[trace.Span]:
        with self._tracer().start_as_current_span(*args, **kwargs) as span:
            yield span


class _Switch(trace.TracerProvider):
    def __init__(self) -> None:
        self.current: TracerProvider | None = None

    def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchTracer(self, instrumenting_module_name)


_SWITCH = _Switch()
trace.set_tracer_provider(_SWITCH)


class Spans:
    """What one test's SDK recorded, finished spans only."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def finished(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {self.names()}"
        return found[0]

    def names(self) -> list[str]:
        return [s.name for s in self.finished()]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        """The direct children of `parent`, in the order they ended."""
        assert parent.context is not None
        return [
            s
            for s in self.finished()
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        ]

    def clear(self) -> None:
        self.exporter.clear()


def listen() -> Spans:
    """Record every span from now on into a new in-memory exporter (until `stop`)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _SWITCH.current = provider
    return Spans(exporter)


def stop() -> None:
    provider, _SWITCH.current = _SWITCH.current, None
    if provider is not None:
        provider.shutdown()
