"""Where the `toolledger` processes send their spans: the standard `OTEL_*` environment.

The library only creates spans through `opentelemetry-api`; this entry point decides whether
anything records them (docs/tracing.md). It reads the variables every OpenTelemetry SDK reads, so
a deployment configures toolledger like its other services:

- `OTEL_TRACES_EXPORTER`: `none` (the default here: no SDK is loaded at all), `console` (one JSON
  object per finished span on stdout, for development), or `otlp` (the OTLP/HTTP exporter,
  which reads `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS` and the rest itself).
- `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`: the resource; the service name defaults
  to `toolledger-<command>`.
- `OTEL_BSP_*`: the batch span processor's delays and sizes.

The SDK and the exporters are not toolledger dependencies: a value that needs one that is not
installed stops the command, naming the package to install. A program that embeds a `Ledger`
configures its own tracer provider instead (or runs under `opentelemetry-instrument`).
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from toolledger.errors import ConfigError

EXPORTERS = ("none", "console", "otlp")


def configure_tracing(command: str) -> bool:
    """Install the SDK's tracer provider as `OTEL_TRACES_EXPORTER` asks; True if it did."""
    choice = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower() or "none"
    if choice not in EXPORTERS:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={choice!r} is not one of {', '.join(EXPORTERS)}; toolledger "
            "processes export spans to the console or over OTLP"
        )
    if choice == "none":
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={choice} needs the OpenTelemetry SDK: "
            "`pip install opentelemetry-sdk`, or unset OTEL_TRACES_EXPORTER"
        ) from None
    defaults = {} if "OTEL_SERVICE_NAME" in os.environ else {SERVICE_NAME: f"toolledger-{command}"}
    provider = TracerProvider(resource=Resource.create(defaults))
    provider.add_span_processor(BatchSpanProcessor(_exporter(choice)))
    trace.set_tracer_provider(provider)
    return True


def _exporter(choice: str) -> Any:
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(formatter=_one_line)
    try:  # imported by name: an optional package, unknown to the type checker when absent
        otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    except ImportError:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER=otlp needs an OTLP exporter: "
            "`pip install opentelemetry-exporter-otlp-proto-http`"
        ) from None
    return otlp.OTLPSpanExporter()


def _one_line(span: Any) -> str:
    """A finished span as one line of JSON, so it can be picked out of a log."""
    return json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n"
