"""`OTEL_TRACES_EXPORTER` for the `toolledger` processes: a bad value stops startup, named.

(The `console` exporter is exercised for real by the reconciler's trace test in
`tests/integration/test_reconciler.py`; it cannot run here, where the suite's own tracer
provider is already installed for the process.)
"""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from toolledger.cli import main
from toolledger.cli.tracing import configure_tracing
from toolledger.errors import ConfigError


def test_an_unknown_exporter_stops_every_command_naming_the_variable() -> None:
    """A typo in the exporter must not leave a process running untraced without a word."""
    result = CliRunner().invoke(main, ["dev", "status"], env={"OTEL_TRACES_EXPORTER": "jaeger"})
    assert result.exit_code == 2
    assert "OTEL_TRACES_EXPORTER='jaeger' is not one of none, console, otlp" in result.output


def test_otlp_without_its_exporter_package_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    # Absent as far as imports go, whether or not some environment has it installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError, match="pip install opentelemetry-exporter-otlp-proto-http"):
        configure_tracing("projector")


@pytest.mark.parametrize("value", [None, "", "none", " NONE "])
def test_no_exporter_loads_nothing(value: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    else:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    assert configure_tracing("projector") is False
