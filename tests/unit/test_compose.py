"""docker-compose.yml cannot run here (no Docker engine), so its structure is checked instead:
it parses, every reference resolves, images are pinned, and every toolledger service runs a
command the CLI really has with settings toolledger accepts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolledger.cli import main
from toolledger.settings import load_settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with VAR unset, as a fresh checkout sees it."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def test_every_dependency_names_a_service_with_the_condition_it_can_meet(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck for {name}"


def test_images_are_pinned_to_a_version(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        image = service.get("image")
        if image is None:
            assert service.get("build"), f"{name} has neither image nor build"
            continue
        tag = image.rpartition(":")[2]
        assert ":" in image and tag not in ("latest", ""), f"{name} image {image} is not pinned"
        assert any(ch.isdigit() for ch in tag), f"{name} image {image} has no version"


def test_toolledger_services_run_real_commands_with_valid_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, service in compose["services"].items():
        if "build" not in service:
            continue
        env = service["environment"]
        for key in [k for k in os.environ if k.startswith("TOOLLEDGER_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, _interpolate(str(value)))
        settings = load_settings()
        assert settings.database_url and settings.kafka_bootstrap
        command = service.get("command")
        if command:
            assert command[0] in main.commands, f"{name} runs unknown command {command[0]!r}"


def test_kafka_never_auto_creates_topics(compose: dict[str, Any]) -> None:
    """Auto-creation would give a typo'd or reset topic no epoch marker; toolledger creates its
    own topics, so the broker must not."""
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
