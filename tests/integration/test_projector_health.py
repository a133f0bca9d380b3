"""`toolledger projector --health-port` on the real services: a projector that runs alone
shows a halted partition in its `/readyz` and `/metrics`, as `toolledger server` does."""

from __future__ import annotations

import socket

import httpx

from tests import builders as b
from tests.integration.procs import Procs, toolledger_env
from tests.isolated import Isolated, running_stack
from toolledger.events.signing import SigningKey, sign
from toolledger.settings import Settings

START_TIMEOUT = 30.0


async def test_a_lone_projector_serves_readyz_503_and_the_gauge_while_a_partition_is_halted(
    isolated: Isolated, procs: Procs
) -> None:
    """A projector without the API had no `/readyz` at all: the orchestrator kept sending it
    traffic-free work while a partition waited for a key nobody knew was missing."""
    settings = isolated.settings(Settings)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = procs.python(
        "projector", "toolledger", "projector", "--status-every", "0.2",
        "--health-port", str(port), env=toolledger_env(settings),
    )  # fmt: skip
    await proc.wait_for(r"owns \[0, 1\];", timeout=START_TIMEOUT)
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as web,
        running_stack(settings, run_projector=False) as stack,
    ):
        ready = await web.get("/readyz")
        assert ready.status_code == 200, ready.text
        unknown = SigningKey.from_seed("ops-unknown", b"a key no projector was given 32b")
        r = b.reserved("halting", "c1", timeout=10)
        for event in (r, b.indeterminate(r, t=1)):
            assert (await stack.commands.append_and_await(event, 10)).accepted
        position = await stack.commands.append(
            sign(b.resolved(r, 2, t=120, signed=False), unknown), 10
        )
        where = f"partition {position.partition} at offset {position.offset}"
        await proc.wait_for(f"HALTED {where}: .*ops-unknown", timeout=START_TIMEOUT)
        ready = await web.get("/readyz")
        assert ready.status_code == 503
        message = ready.json()["error"]["message"]
        assert f"partition {position.partition} is halted at offset {position.offset}" in message
        assert "Deploy keys before signers" in message
        metrics = (await web.get("/metrics")).text
        gauge = f'toolledger_projector_partition_halted{{partition="{position.partition}"}} 1.0'
        assert gauge in metrics
