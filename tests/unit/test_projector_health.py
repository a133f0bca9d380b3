"""A halted partition and the lag must be visible where an operator looks (issue 26, item 5).

Before, a partition halted by an operator event signed with an unknown key id logged one ERROR
line; the status line, `/readyz` (200), the metrics and the console said nothing while every
call of the partition's runs waited. Here the embedded ledger halts a partition that way and
each of the four places must name the partition, the offset and what to deploy.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import REGISTRY

from tests import api_support as s
from tests import builders as b
from tests.integration.procs import until
from toolledger.api import create_app
from toolledger.api.closing import close_stack
from toolledger.api.tokens import MemoryTokens
from toolledger.events.signing import SigningKey, sign
from toolledger.projections.health import ProjectorHealth
from toolledger.wiring.stack import LedgerStack

#: A key id no projector here has the public key of.
UNKNOWN = SigningKey.from_seed("ops-unknown", b"a key no projector was given 32b")


@dataclass
class HaltedScene:
    stack: LedgerStack
    health: ProjectorHealth
    partition: int
    offset: int


async def _halts(stack: LedgerStack, partition: int) -> None:
    projector = stack.projector
    assert projector is not None
    await until(lambda: partition in projector.stats.halted, timeout=10, what="the halt")


@pytest.fixture
async def scene() -> AsyncIterator[HaltedScene]:
    stack = await LedgerStack.memory(verify_keys=s.KEYS)
    try:
        r = b.reserved("halting", "c1", timeout=10)
        for event in (r, b.indeterminate(r, t=1)):
            assert (await stack.commands.append_and_await(event, 10)).accepted
        position = await stack.commands.append(
            sign(b.resolved(r, 2, t=120, signed=False), UNKNOWN), 10
        )
        await stack.commands.append(b.reserved("halting", "c2", t=130), 10)
        await _halts(stack, position.partition)
        assert stack.projector is not None
        health = ProjectorHealth(stack.projector, stack.events)
        await health.refresh()
        yield HaltedScene(stack, health, position.partition, position.offset)
    finally:
        await close_stack(stack)


def _names_the_trouble(text: str, scene: HaltedScene) -> None:
    assert f"partition {scene.partition}" in text
    assert f"offset {scene.offset}" in text
    assert "ops-unknown" in text and "Deploy keys before signers" in text


async def test_the_status_line_names_the_halted_partition_its_offset_and_what_to_deploy(
    scene: HaltedScene,
) -> None:
    line = scene.health.status_line()
    assert f"HALTED partition {scene.partition} at offset {scene.offset}" in line
    _names_the_trouble(line, scene)


async def test_the_lag_counts_the_records_a_halted_partition_has_not_folded(
    scene: HaltedScene,
) -> None:
    """The unknown-key resolve and the reservation after it wait behind the halt: 2 records."""
    assert scene.health.lag()[scene.partition] == 2
    assert f"p{scene.partition}=2" in scene.health.status_line()


async def test_the_gauges_say_which_partition_is_halted_and_how_far_behind_it_is(
    scene: HaltedScene,
) -> None:
    labels = {"partition": str(scene.partition)}
    assert REGISTRY.get_sample_value("toolledger_projector_partition_halted", labels) == 1
    assert REGISTRY.get_sample_value("toolledger_projector_partition_lag_records", labels) == 2
    others = set(scene.stack.projector.owned if scene.stack.projector else ()) - {scene.partition}
    for partition in others:
        halted = {"partition": str(partition)}
        assert REGISTRY.get_sample_value("toolledger_projector_partition_halted", halted) == 0


@pytest.fixture
async def browser(scene: HaltedScene) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    tokens = MemoryTokens()
    app = create_app(scene.stack, s.api_settings(), tokens=tokens, health=scene.health)
    async with s.client(app) as client:
        yield client, await s.token(tokens)


async def test_readyz_is_503_naming_the_partition_the_offset_and_what_to_deploy(
    browser: tuple[httpx.AsyncClient, str], scene: HaltedScene
) -> None:
    client, _ = browser
    ready = await client.get("/readyz")
    assert ready.status_code == 503
    _names_the_trouble(ready.json()["error"]["message"], scene)


async def test_metrics_served_by_the_api_carry_the_halted_gauge(
    browser: tuple[httpx.AsyncClient, str], scene: HaltedScene
) -> None:
    client, _ = browser
    text = (await client.get("/metrics", headers=s.METRICS_AUTH)).text
    assert f'toolledger_projector_partition_halted{{partition="{scene.partition}"}} 1.0' in text
    assert (
        f'toolledger_projector_partition_lag_records{{partition="{scene.partition}"}} 2.0' in text
    )


async def test_every_console_page_shows_a_banner_naming_the_halted_partition(
    browser: tuple[httpx.AsyncClient, str], scene: HaltedScene
) -> None:
    client, bearer = browser
    page = await client.get("/console/signin")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert csrf is not None
    signed = await client.post(
        "/console/signin", data={"csrf_token": csrf.group(1), "token": bearer}
    )
    assert signed.status_code == 303, signed.text
    queue = await client.get("/console/queue")
    banner = re.search(r'<div class="banner" role="alert">(.*?)</div>', queue.text, re.S)
    assert banner is not None, queue.text[:2000]
    _names_the_trouble(banner.group(1).replace("&#39;", "'"), scene)
    assert f"partition {scene.partition}: 2" in queue.text  # the lag line
