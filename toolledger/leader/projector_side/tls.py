"""TLS on the leader's side of its connections: its certificate, and runtimes' required.

A projector given `TOOLLEDGER_LEADER_TLS_CERT` and `_KEY` listens over TLS; with
`TOOLLEDGER_LEADER_TLS_RUNTIME_CA` it completes a handshake only with a runtime presenting a
certificate from that CA. What the runtime checks, and the certificate checks that run when
settings load, are the runtime side's (`toolledger.leader.runtime_side.tls`), whose module
docstring tells the whole arrangement.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Any

from toolledger.leader.runtime_side.tls import HANDSHAKE_TIMEOUT, SHUTDOWN_TIMEOUT, no_password


def server_context(cert: Path, key: Path, runtime_ca: Path | None) -> ssl.SSLContext:
    """The leader's side: its certificate, and runtimes' certificates required if `runtime_ca`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key, password=no_password)
    if runtime_ca is not None:
        context.load_verify_locations(cafile=runtime_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def server_options(context: ssl.SSLContext | None) -> dict[str, Any]:
    """`asyncio.start_server` keywords for a leader with `context` (None: plain TCP)."""
    if context is None:
        return {}
    return {
        "ssl": context,
        "ssl_handshake_timeout": HANDSHAKE_TIMEOUT,
        "ssl_shutdown_timeout": SHUTDOWN_TIMEOUT,
    }


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP, as a bound address is, or `localhost`) stays on this machine."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
