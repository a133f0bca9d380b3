"""A leader listens on one address and is reached at another: `TOOLLEDGER_LEADER_ADVERTISE`.

In docker-compose the leader registered the 127.0.0.1 it listened on inside its container, so
runtimes in other containers always took the direct path, and nothing said so. A server
listening on every address (`0.0.0.0`) must register the address runtimes reach it at, and a
runtime that cannot reach a registered leader must say so once, at WARNING, naming the address.
"""

from __future__ import annotations

import logging
import socket
import subprocess
from pathlib import Path

import pytest

from tests import api_support as s
from tests.integration.leader_support import all_led, calls, leader_settings, runtime_port
from tests.integration.procs import Procs, toolledger_env
from tests.isolated import Isolated, running_stack
from toolledger.errors import ConfigError
from toolledger.settings import ProjectorSettings, load_settings

START_TIMEOUT = 40.0


def _reachable_address() -> str:
    """An address of this machine that is not loopback (a container's on its network), else
    a second loopback address, which is not the one the leader would have registered."""
    shown = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False)
    for address in shown.stdout.split():
        if "." in address and not address.startswith("127."):
            return address
    return "127.0.0.2"


async def test_a_server_on_every_address_serves_runtimes_at_the_one_it_advertises(
    isolated: Isolated, procs: Procs, tmp_path: Path
) -> None:
    ip = _reachable_address()
    settings = leader_settings(isolated)
    env = {
        **toolledger_env(settings),
        "TOOLLEDGER_SIGNING_KEYS": s.SIGNING_KEY.setting(),
        "TOOLLEDGER_VERIFY_KEYS": s.SIGNING_KEY.public_setting(),
        "TOOLLEDGER_LEADER_LISTEN": "0.0.0.0:0",
        "TOOLLEDGER_LEADER_ADVERTISE": ip,
    }
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        api_port = probe.getsockname()[1]
    server = procs.python(
        "server", "toolledger", "server", "--port", str(api_port), "--status-every", "0.2", env=env
    )
    await server.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT)
    listening = await server.wait_for(r"leader listening on 0\.0\.0\.0:(\d+)", timeout=5)
    async with (
        running_stack(settings, run_projector=False) as stack,
        runtime_port(stack, settings) as port,
    ):
        leaders = await all_led(port, settings.partitions)
        assert set(leaders.values()) == {f"{ip}:{listening[1]}"}
        verdicts = [(await port.append_and_await(e, 10)).accepted for e in calls(4, "adv")]
        assert verdicts == [True] * 8
        assert port.stats == {"leader": 8, "direct": 0}
    assert server.alive(), server.output()[-3000:]


async def test_a_leader_the_runtime_cannot_reach_is_named_once_at_warning(
    isolated: Isolated, procs: Procs, caplog: pytest.LogCaptureFixture
) -> None:
    """The advertised address here leads nowhere (nothing listens on port 1): every call goes
    direct, and the runtime's log says why once, not once per call or per partition."""
    settings = leader_settings(isolated)
    env = {**toolledger_env(settings), "TOOLLEDGER_LEADER_ADVERTISE": "127.0.0.1:1"}
    projector = procs.projector("projector", env)
    await projector.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT)
    caplog.set_level(logging.INFO, logger="toolledger.leader")
    async with (
        running_stack(settings, run_projector=False) as stack,
        runtime_port(stack, settings) as port,
    ):
        await all_led(port, settings.partitions)
        verdicts = [(await port.append_and_await(e, 10)).accepted for e in calls(6, "far")]
        assert verdicts == [True] * 12
        assert port.stats["leader"] == 0
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "127.0.0.1:1" in said[0].getMessage()
    assert "TOOLLEDGER_LEADER_ADVERTISE" in said[0].getMessage()


def test_a_wildcard_listen_address_needs_the_advertised_one() -> None:
    """Runtimes connect to what is registered: 0.0.0.0 registered reaches nobody."""
    with pytest.raises(ConfigError, match="TOOLLEDGER_LEADER_ADVERTISE"):
        load_settings(ProjectorSettings, leader_listen="0.0.0.0:7311")
    settings = load_settings(
        ProjectorSettings, leader_listen="0.0.0.0:7311", leader_advertise="server:7311"
    )
    assert settings.leader_advertise == "server:7311"
    with pytest.raises(ConfigError, match="TOOLLEDGER_LEADER_ADVERTISE"):
        load_settings(ProjectorSettings, leader_advertise="0.0.0.0")  # noqa: S104 -- refused
