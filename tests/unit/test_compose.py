"""docker-compose.yml cannot run here (no Docker engine), so its structure is checked instead:
it parses, every reference resolves, images are pinned, and every toolledger service runs a
command the CLI really has with settings toolledger accepts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from toolledger.cli import main
from toolledger.events.signing import SigningKey
from toolledger.settings import OperatorSettings, ProjectorSettings, load_settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


#: What a user exports before `docker compose up` (compose refuses `${VAR:?...}` unset).
_KEY = SigningKey.from_seed("ops-1", b"compose-test-operator-signing-k1")
_EXPORTED = {
    "TOOLLEDGER_VERIFY_KEYS": _KEY.public_setting(),
    "TOOLLEDGER_SIGNING_KEYS": _KEY.setting(),
}


def _interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with VAR unset, as a fresh checkout sees it, and its
    `${VAR:?message}` with what the compose file's header tells the user to export."""
    value = re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", lambda m: _EXPORTED[m.group(1)], value)
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
            known = main.get_command(click.Context(main), command[0])
            assert known is not None, f"{name} runs unknown command {command[0]!r}"
        if command and command[0] == "projector":
            load_settings(ProjectorSettings).require_verify_keys()
        if command and command[0] == "api":
            load_settings(OperatorSettings).require_signing_key()


def test_only_the_api_and_the_operator_cli_get_the_private_key(compose: dict[str, Any]) -> None:
    """The reconciler and the resumer run user code: with the private key in their environment
    they could sign an approval (issue 15). Projectors get only the public keys."""
    holders = {
        name
        for name, service in compose["services"].items()
        if "TOOLLEDGER_SIGNING_KEYS" in (service.get("environment") or {})
    }
    assert holders == {"api", "cli"}
    projector = compose["services"]["projector"]["environment"]
    assert "TOOLLEDGER_VERIFY_KEYS" in projector


def test_kafka_never_auto_creates_topics(compose: dict[str, Any]) -> None:
    """Auto-creation would give a typo'd or reset topic no epoch marker; toolledger creates its
    own topics, so the broker must not."""
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
