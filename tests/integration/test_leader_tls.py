"""The leader over TLS with client certificates, on real sockets and Kafka + PostgreSQL.

A leader given its certificate, its key and the runtimes' CA (`TOOLLEDGER_LEADER_TLS_*`)
answers only runtimes whose certificate chains to that CA, and a runtime given the leaders'
CA (`TOOLLEDGER_RUNTIME_TLS_*`) talks only to a leader whose certificate chains to it and
names the address it reached (or `TOOLLEDGER_RUNTIME_TLS_LEADER_NAME`). Everyone else is
stopped by the handshake and takes the direct path at once, never waiting out the bound, with
nothing lost or applied twice. Certificates are made in each test by a throwaway CA
(`tests.tls_certs`). Named for the failure each guards against.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.leader_support import (
    all_led,
    calls,
    history_count,
    leader_settings,
    runtime_port,
)
from tests.integration.procs import Procs, toolledger_env
from tests.isolated import Isolated, running_stack
from tests.tls_certs import Authority, Leaf
from toolledger.leader.runtime_side.frames import Kind, encode_frame
from toolledger.leader.runtime_side.port import LeaderPort

#: A bound far above a refused handshake's cost: a refusal noticed only by the bound would
#: show as calls waiting for it.
BOUND_MS = 4000


@dataclass(frozen=True)
class Pki:
    """The ledger's CA with a leader's and a runtime's certificate, and an impostor's CA."""

    ca: Authority
    leader: Leaf
    named_leader: Leaf
    runtime: Leaf
    impostor: Leaf

    def leader_side(self, leaf: Leaf) -> dict[str, Any]:
        return {
            "leader_tls_cert": leaf.cert,
            "leader_tls_key": leaf.key,
            "leader_tls_runtime_ca": self.ca.cert,
        }

    def names(self, leader: Leaf) -> dict[str, Any]:
        """What a runtime sets to check `leader`'s certificate (nothing: its IP is in it)."""
        if leader is self.named_leader:
            return {"runtime_tls_leader_name": "leader.toolledger.test"}
        return {}

    def runtime_side(self, leaf: Leaf | None = None, **more: Any) -> dict[str, Any]:
        own = {} if leaf is None else {"runtime_tls_cert": leaf.cert, "runtime_tls_key": leaf.key}
        return {"runtime_tls_leader_ca": self.ca.cert, **own, **more}


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = Authority.new("ledger", tmp_path)
    return Pki(
        ca,
        leader=ca.issue("leader", ips=("127.0.0.1",)),
        named_leader=ca.issue("named-leader", dns=("leader.toolledger.test",)),
        runtime=ca.issue("runtime", client=True),
        impostor=Authority.new("other", tmp_path).issue("runtime", client=True),
    )


def _env(fields: dict[str, Any]) -> dict[str, str]:
    return {f"TOOLLEDGER_{name.upper()}": str(value) for name, value in fields.items()}


async def _verdicts_over(port: LeaderPort, n: int, tag: str) -> list[bool]:
    return [(await port.append_and_await(e, 10)).accepted for e in calls(n, tag)]


@pytest.mark.parametrize("checked", ["ip", "name"])
async def test_a_runtime_with_a_certificate_from_the_ledgers_ca_gets_verdicts_over_tls(
    isolated: Isolated, pki: Pki, tmp_path: Path, checked: str
) -> None:
    """A projector process configured for TLS must answer a runtime holding a certificate of
    its CA from memory, over TLS, whether the leader's certificate names its IP (checked
    against the registered address) or a DNS name (checked against
    TOOLLEDGER_RUNTIME_TLS_LEADER_NAME); and its listener must speak nothing but TLS."""
    settings = leader_settings(isolated, leader_timeout_ms=BOUND_MS)
    leader = pki.leader if checked == "ip" else pki.named_leader
    runtime = leader_settings(
        isolated, leader_timeout_ms=BOUND_MS, **pki.runtime_side(pki.runtime, **pki.names(leader))
    )
    procs = Procs(tmp_path)
    try:
        env = {**toolledger_env(settings), **_env(pki.leader_side(leader))}
        projector = procs.projector("tls-leader", env)
        async with (
            running_stack(settings, run_projector=False) as stack,
            runtime_port(stack, runtime) as port,
        ):
            leaders = await all_led(port, settings.partitions)
            assert await _verdicts_over(port, 4, "tls") == [True] * 8
            assert port.stats == {"leader": 8, "direct": 0}
            host, _, number = str(next(iter(leaders.values()))).rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(number))
            writer.write(encode_frame(Kind.READ, 1, b'{"key": "tls-0:c0", "run_id": "tls-0"}'))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b"", "answered in plain TCP"
            writer.close()
        assert projector.alive(), projector.output()[-3000:]
        assert "Traceback" not in projector.output()
    finally:
        procs.close()


_REFUSED: dict[str, Callable[[Pki], dict[str, Any]]] = {
    # the leader refuses the runtime: no certificate, one of another CA, no TLS at all
    "no-client-certificate": lambda pki: pki.runtime_side(),
    "certificate-of-another-ca": lambda pki: pki.runtime_side(pki.impostor),
    "plain-tcp": lambda pki: {},
    # the runtime refuses the leader: its certificate names a DNS name, not the address
    "leader-certificate-without-its-ip": lambda pki: pki.runtime_side(pki.runtime),
}


@pytest.mark.parametrize("case", list(_REFUSED))
async def test_a_handshake_that_fails_sends_the_call_direct_at_once_none_lost_or_doubled(
    isolated: Isolated, pki: Pki, case: str
) -> None:
    """A runtime and a TLS leader that do not trust each other must not hold a call: the
    handshake's failure sends it direct at once (long before the bound), with the same
    event_id, so every call gets its verdict and none is applied twice; the projector and its
    leader go on, still answering the runtimes it trusts."""
    leader = pki.named_leader if case == "leader-certificate-without-its-ip" else pki.leader
    settings = leader_settings(isolated, leader_timeout_ms=BOUND_MS, **pki.leader_side(leader))
    runtime = leader_settings(isolated, leader_timeout_ms=BOUND_MS, **_REFUSED[case](pki))
    async with running_stack(settings) as stack, runtime_port(stack, runtime) as port:
        await all_led(port, settings.partitions)
        events = calls(4, "refused")
        started = time.monotonic()
        verdicts = [await port.append_and_await(e, 10) for e in events]
        elapsed = time.monotonic() - started
        assert port.stats == {"leader": 0, "direct": len(events)}
        assert elapsed < BOUND_MS / 1000, f"{elapsed:.2f}s: a refusal waited for the bound"
        assert [v.accepted for v in verdicts] == [True] * len(events)
        ids = [e.event_id for e in events]
        assert await history_count(isolated, ids) == dict.fromkeys(ids, 1)
        assert not stack.projector_task.done()
        trusted = leader_settings(isolated, **pki.runtime_side(pki.runtime, **pki.names(leader)))
        async with runtime_port(stack, trusted) as port:
            assert await _verdicts_over(port, 1, "trusted") == [True, True]
            assert port.stats == {"leader": 2, "direct": 0}
