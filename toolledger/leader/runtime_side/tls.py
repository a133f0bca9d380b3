"""TLS on the leader's connections, with certificates on both ends (stdlib `ssl` only): the
runtime's side, and the certificate checks both sides' settings run. The leader's side
(its server context) is `toolledger.leader.projector_side.tls`.

By default a leader listens on loopback in plain TCP: nothing leaves the machine. Where
runtimes reach leaders over a network that is not private, each end proves what it is: the
leader presents a certificate from the CA runtimes trust for leaders
(`TOOLLEDGER_RUNTIME_TLS_LEADER_CA`), and, when the leader is given the CA of runtimes
(`TOOLLEDGER_LEADER_TLS_RUNTIME_CA`), it completes a handshake only with a runtime presenting
a certificate from it. A handshake that fails ends the connection before a frame is read, so
the runtime takes the direct path (`toolledger.leader.runtime_side.port`), as for any leader that
does not answer. TLS 1.2 at least.

**The name a runtime checks.** A leader registers the address it is bound to
(`projection_offsets.leader_address`), and a bound address is always an IP. So by default the
runtime checks that IP: the leader's certificate must carry it as an IP-address subject
alternative name (`ssl` matches an IP only against those, never against a DNS name or the
common name). Certificates issued to a name instead (leaders that move between machines under
one service name) are checked against `TOOLLEDGER_RUNTIME_TLS_LEADER_NAME`, one DNS name every
leader's certificate carries; then any certificate of that name and CA may answer for any
partition, which is what every leader may do anyway (who leads is PostgreSQL's lock, not the
certificate's).

The checks here run when settings load (`toolledger.settings`), so an unreadable file, a file
that is not PEM, or a key that is not the certificate's stops startup naming its setting;
keys must be unencrypted PEM (protect the file, mode 0600).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds a connection has to complete its TLS handshake (one that sends nothing is dropped).
HANDSHAKE_TIMEOUT = 10.0
#: Seconds a closing TLS connection waits for the peer's close_notify.
SHUTDOWN_TIMEOUT = 2.0


def no_password() -> bytes:
    """Refuses an encrypted key instead of letting OpenSSL prompt on the terminal."""
    return b""


def _read(path: Path, load: Callable[[], None], what: str) -> None:
    """Run `load` (an `ssl` load of `path`); `ValueError` saying `path` is not `what`."""
    if not path.is_file():
        raise ValueError(f"{path} is not a readable file")
    try:
        load()
    except ssl.SSLError as exc:
        reason = f" ({exc.reason})" if exc.reason and exc.reason != "PEM lib" else ""
        raise ValueError(f"{path} is not {what}{reason}") from None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or exc})") from None


def check_certificates(path: Path) -> None:
    """`ValueError` unless `path` is a readable file holding PEM certificates."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _read(path, lambda: context.load_verify_locations(cafile=path), "a PEM certificate file")


def check_key(cert: Path, key: Path, cert_setting: str) -> None:
    """`ValueError` unless `key` is the unencrypted PEM private key of the certificate `cert`
    (set by `cert_setting`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _read(
        key,
        lambda: context.load_cert_chain(cert, key, password=no_password),
        f"an unencrypted PEM private key of the certificate in {cert_setting}",
    )


@dataclass(frozen=True)
class ClientTLS:
    """A runtime's side: the context (the leaders' CA, its own certificate if any) and the
    name to check on every leader's certificate (None: the registered address's host)."""

    context: ssl.SSLContext
    leader_name: str | None = None

    @classmethod
    def load(
        cls, leader_ca: Path, cert: Path | None, key: Path | None, leader_name: str | None
    ) -> ClientTLS:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=leader_ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert is not None and key is not None:
            context.load_cert_chain(cert, key, password=no_password)
        return cls(context, leader_name)


def client_options(tls: ClientTLS | None, host: str) -> dict[str, Any]:
    """`asyncio.open_connection` keywords to reach a leader registered at `host`."""
    if tls is None:
        return {}
    return {
        "ssl": tls.context,
        "server_hostname": tls.leader_name or host,
        "ssl_handshake_timeout": HANDSHAKE_TIMEOUT,
        "ssl_shutdown_timeout": SHUTDOWN_TIMEOUT,
    }
