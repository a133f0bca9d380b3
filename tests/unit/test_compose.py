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

from toolledger.api.compensation import load_tools
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


def _reads_the_keys_volume(service: dict[str, Any]) -> bool:
    """Whether `service` runs toolledger through the entrypoint that exports the keys volume's
    two files as `TOOLLEDGER_VERIFY_KEYS` and `TOOLLEDGER_SIGNING_KEYS`."""
    entrypoint = service.get("entrypoint") or []
    script = " ".join(str(part) for part in entrypoint)
    return "cat /keys/verify" in script and 'exec toolledger "$$@"' in script


def test_the_stack_is_kafka_postgres_a_one_shot_key_setup_and_the_server(
    compose: dict[str, Any],
) -> None:
    """Issue 26: one server process serves every role; what runs by default is the two services
    it needs, the key setup (run once, to completion) and the server."""
    services = compose["services"]
    running = {name for name, service in services.items() if not service.get("profiles")}
    assert running == {"kafka", "postgres", "keys", "server"}
    assert services["keys"]["restart"] == "no"
    assert services["server"]["depends_on"]["keys"] == {
        "condition": "service_completed_successfully"
    }
    script = services["keys"]["command"][0]
    assert "toolledger keys new" in script
    assert main.get_command(click.Context(main), "keys") is not None
    assert "already made" in script, "the key setup must never replace keys already made"


def test_toolledger_services_run_real_commands_with_valid_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, service in compose["services"].items():
        if "build" not in service or name == "keys":
            continue
        env = dict(service["environment"])
        if _reads_the_keys_volume(service):
            env.update(_EXPORTED)
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
        if command and command[0] == "server":
            load_settings(ProjectorSettings).require_verify_keys()
            load_settings(OperatorSettings).require_signing_key()
            tools = _interpolate(str(env["TOOLLEDGER_TOOLS"]))
            assert load_tools([tools]), f"{name}: TOOLLEDGER_TOOLS={tools} declares no tools"


def test_the_image_holds_the_example_tools_and_the_server_extra() -> None:
    """The compose file's default TOOLLEDGER_TOOLS is an example module: the image must have
    it, and the server role's dependencies (faust, FastAPI, uvicorn, Jinja2)."""
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert "COPY toolledger ./toolledger" in dockerfile  # toolledger.examples among it
    assert re.search(r"pip install [^\n]*\.\[server\]", dockerfile)


def test_no_service_is_given_the_private_key_in_its_environment(compose: dict[str, Any]) -> None:
    """The private key is read from the keys volume by the server and the operator CLI only;
    inside the server, the reconciler and the resumer (which run user code) are started without
    it (tests/unit/test_server_children.py), so no compose environment may carry it either."""
    for name, service in compose["services"].items():
        assert "TOOLLEDGER_SIGNING_KEYS" not in (service.get("environment") or {}), name
    readers = {
        name
        for name, service in compose["services"].items()
        if any(str(v).startswith("keys:") for v in service.get("volumes") or [])
    }
    assert readers == {"keys", "server", "cli"}
    assert {n for n, svc in compose["services"].items() if _reads_the_keys_volume(svc)} == {
        "server",
        "cli",
    }


def test_kafka_never_auto_creates_topics(compose: dict[str, Any]) -> None:
    """Auto-creation would give a typo'd or reset topic no epoch marker; toolledger creates its
    own topics, so the broker must not."""
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_the_server_registers_a_leader_address_other_containers_reach(
    compose: dict[str, Any],
) -> None:
    """The leader registered the 127.0.0.1 it listened on inside its container, so every
    runtime in another container took the direct path without a word. It must listen on every
    address and advertise the service's name, at a port the compose network reaches."""
    server = compose["services"]["server"]
    env = {k: _interpolate(str(v)) for k, v in server["environment"].items()}
    settings = load_settings(
        ProjectorSettings,
        leader_listen=env["TOOLLEDGER_LEADER_LISTEN"],
        leader_advertise=env["TOOLLEDGER_LEADER_ADVERTISE"],
    )
    host, _, port = str(settings.leader_advertise).rpartition(":")
    assert host == "server" and port == settings.leader_listen.rpartition(":")[2] != "0"


def test_an_agent_on_the_host_reaches_kafka_and_postgresql(compose: dict[str, Any]) -> None:
    """Kafka advertised only `kafka:9092` and nothing was published: an agent on the host
    could not connect. Kafka needs a listener advertised as localhost and published; so does
    PostgreSQL's port (on the host's loopback only)."""
    kafka = compose["services"]["kafka"]
    env = kafka["environment"]
    advertised = dict(item.split("://", 1) for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    host_listener = [name for name, at in advertised.items() if at.startswith("localhost:")]
    assert host_listener, advertised
    port = advertised[host_listener[0]].rpartition(":")[2]
    assert f"127.0.0.1:{port}:{port}" in [_interpolate(p) for p in kafka["ports"]]
    assert f"{host_listener[0]}:PLAINTEXT" in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    postgres = [_interpolate(p) for p in compose["services"]["postgres"]["ports"]]
    assert any(p.startswith("127.0.0.1:") and p.endswith(":5432") for p in postgres), postgres


def test_your_own_tools_go_into_the_image_by_a_documented_build_argument() -> None:
    """Nothing said how to put your own tools module into the image; the default is the
    example billing tools. The Dockerfile takes packages to install beside toolledger, and the
    compose file passes them through."""
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert "ARG TOOLLEDGER_EXTRA_PACKAGES" in dockerfile
    assert re.search(r"pip install [^\n]*\$\{?TOOLLEDGER_EXTRA_PACKAGES", dockerfile)
    text = COMPOSE.read_text()
    assert "TOOLLEDGER_EXTRA_PACKAGES: ${TOOLLEDGER_EXTRA_PACKAGES:-}" in text
    assert "docs/production.md" in text and "your own tools" in text.lower()
