"""The leader's TLS settings, per role, without a network.

A TLS setting that cannot work (a certificate without its key, a file that is missing or is
not PEM, a key that is not the certificate's, a CA for clients on a leader without TLS) must
stop startup with an error naming that variable, read from the environment as an operator
sets it, never surface later as refused connections that all look alike. The leader's own key
is the projector's (`ProjectorSettings`), so the processes `toolledger server` runs user code
in never see it; a runtime's are in the shared block every runtime reads. A leader listening
beyond loopback without checking runtimes' certificates is allowed but warned of.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.tls_certs import Authority, Leaf
from toolledger.errors import ConfigError
from toolledger.server.children import PRIVATE_TO_SERVER
from toolledger.settings import ProjectorSettings, Settings, load_settings
from toolledger.wiring.projector_leader import exposure_warning


class Files:
    """A CA, a leader's and a runtime's certificates from it, and some bad files."""

    def __init__(self, directory: Path) -> None:
        self.ca = Authority.new("leaders", directory)
        self.leader = self.ca.issue("leader", ips=("127.0.0.1",))
        self.runtime = self.ca.issue("runtime", client=True)
        self.missing = directory / "missing.pem"
        self.not_pem = directory / "not.pem"
        self.not_pem.write_text("not a certificate\n")
        self.encrypted = directory / "encrypted.key"
        self.encrypted.write_bytes(
            ec.generate_private_key(ec.SECP256R1()).private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
        )

    def path(self, name: str) -> Path:
        """`leader.cert`, `runtime.key`, `ca`, `missing`, ... as a path."""
        owner, _, part = name.partition(".")
        found = getattr(self, owner)
        if isinstance(found, Authority):
            return found.cert
        path = getattr(found, part) if isinstance(found, Leaf) else found
        assert isinstance(path, Path)
        return path


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def _load(monkeypatch: pytest.MonkeyPatch, files: Files, env: dict[str, str]) -> Settings:
    for variable, name in env.items():
        value = name if variable.endswith("_NAME") else str(files.path(name))
        monkeypatch.setenv(f"TOOLLEDGER_{variable}", value)
    return load_settings(ProjectorSettings)


_BAD = [
    # the runtime's side (the shared block)
    ({"RUNTIME_TLS_CERT": "runtime.cert", "RUNTIME_TLS_LEADER_CA": "ca"}, "RUNTIME_TLS_KEY"),
    ({"RUNTIME_TLS_KEY": "runtime.key", "RUNTIME_TLS_LEADER_CA": "ca"}, "RUNTIME_TLS_KEY"),
    (
        {"RUNTIME_TLS_CERT": "runtime.cert", "RUNTIME_TLS_KEY": "runtime.key"},
        "RUNTIME_TLS_LEADER_CA",
    ),
    ({"RUNTIME_TLS_LEADER_NAME": "leader.test"}, "RUNTIME_TLS_LEADER_NAME"),
    ({"RUNTIME_TLS_LEADER_CA": "missing"}, "RUNTIME_TLS_LEADER_CA"),
    ({"RUNTIME_TLS_LEADER_CA": "not_pem"}, "RUNTIME_TLS_LEADER_CA"),
    (
        {
            "RUNTIME_TLS_CERT": "not_pem",
            "RUNTIME_TLS_KEY": "runtime.key",
            "RUNTIME_TLS_LEADER_CA": "ca",
        },
        "RUNTIME_TLS_CERT",
    ),
    (
        {
            "RUNTIME_TLS_CERT": "runtime.cert",
            "RUNTIME_TLS_KEY": "leader.key",
            "RUNTIME_TLS_LEADER_CA": "ca",
        },
        "RUNTIME_TLS_KEY",
    ),
    # the leader's side (the projector's own)
    ({"LEADER_TLS_CERT": "leader.cert"}, "LEADER_TLS_KEY"),
    ({"LEADER_TLS_KEY": "leader.key"}, "LEADER_TLS_KEY"),
    ({"LEADER_TLS_CERT": "missing", "LEADER_TLS_KEY": "leader.key"}, "LEADER_TLS_CERT"),
    ({"LEADER_TLS_CERT": "leader.key", "LEADER_TLS_KEY": "leader.key"}, "LEADER_TLS_CERT"),
    ({"LEADER_TLS_CERT": "leader.cert", "LEADER_TLS_KEY": "not_pem"}, "LEADER_TLS_KEY"),
    ({"LEADER_TLS_CERT": "leader.cert", "LEADER_TLS_KEY": "encrypted"}, "LEADER_TLS_KEY"),
    ({"LEADER_TLS_CERT": "leader.cert", "LEADER_TLS_KEY": "missing"}, "LEADER_TLS_KEY"),
    ({"LEADER_TLS_RUNTIME_CA": "ca"}, "LEADER_TLS_RUNTIME_CA"),
    (
        {
            "LEADER_TLS_CERT": "leader.cert",
            "LEADER_TLS_KEY": "leader.key",
            "LEADER_TLS_RUNTIME_CA": "not_pem",
        },
        "LEADER_TLS_RUNTIME_CA",
    ),
]


@pytest.mark.parametrize(
    ("env", "variable"), _BAD, ids=[f"{v}-{i}" for i, (_, v) in enumerate(_BAD)]
)
def test_a_half_set_or_unreadable_tls_setting_stops_startup_naming_it(
    monkeypatch: pytest.MonkeyPatch, files: Files, env: dict[str, str], variable: str
) -> None:
    """Each TLS setting that cannot work must be the one problem reported, by its variable:
    a leader or runtime must not start on a half configuration and refuse every peer later."""
    with pytest.raises(ConfigError) as raised:
        _load(monkeypatch, files, env)
    problems = re.findall(r"(?:: |; )(TOOLLEDGER_\w+): ", str(raised.value))
    assert problems == [f"TOOLLEDGER_{variable}"], str(raised.value)


def test_both_roles_tls_settings_load_and_empty_ones_are_unset(
    monkeypatch: pytest.MonkeyPatch, files: Files
) -> None:
    """A full configuration of each role loads as given; a variable set to "" (what compose
    passes for an unset one) is unset, not the current directory."""
    settings = _load(
        monkeypatch,
        files,
        {
            "LEADER_TLS_CERT": "leader.cert",
            "LEADER_TLS_KEY": "leader.key",
            "LEADER_TLS_RUNTIME_CA": "ca",
            "RUNTIME_TLS_CERT": "runtime.cert",
            "RUNTIME_TLS_KEY": "runtime.key",
            "RUNTIME_TLS_LEADER_CA": "ca",
            "RUNTIME_TLS_LEADER_NAME": "leader.test",
        },
    )
    assert isinstance(settings, ProjectorSettings)
    assert (settings.leader_tls_cert, settings.leader_tls_runtime_ca) == (
        files.leader.cert,
        files.ca.cert,
    )
    assert (settings.runtime_tls_key, settings.runtime_tls_leader_name) == (
        files.runtime.key,
        "leader.test",
    )
    monkeypatch.setenv("TOOLLEDGER_RUNTIME_TLS_CERT", "")
    monkeypatch.setenv("TOOLLEDGER_RUNTIME_TLS_KEY", " ")
    assert load_settings(Settings).runtime_tls_cert is None


def test_the_leaders_key_is_the_projectors_and_a_runtimes_is_in_the_shared_block() -> None:
    """The leader's certificate and key must not reach the children `toolledger server` runs
    user code in (the resumer, the reconciler); a runtime's must, since a resumer is one."""
    leader = {
        "TOOLLEDGER_LEADER_TLS_CERT",
        "TOOLLEDGER_LEADER_TLS_KEY",
        "TOOLLEDGER_LEADER_TLS_RUNTIME_CA",
    }
    assert leader <= PRIVATE_TO_SERVER
    assert not {v for v in PRIVATE_TO_SERVER if v.startswith("TOOLLEDGER_RUNTIME_TLS_")}
    assert "runtime_tls_key" in Settings.model_fields


@pytest.mark.parametrize("listen", ["0.0.0.0:7311", "[::]:7311", ":::0"])
def test_a_wildcard_listen_address_stops_startup(listen: str) -> None:
    """The listen address is what runtimes are told to connect to; a wildcard names no machine."""
    with pytest.raises(ConfigError, match=r"TOOLLEDGER_LEADER_LISTEN: .*wildcard"):
        load_settings(None, leader_listen=listen)


@pytest.mark.parametrize(
    ("address", "tls", "verifies", "warns"),
    [
        ("127.0.0.1:7311", False, False, None),
        ("::1:7311", False, False, None),
        ("192.0.2.7:7311", False, False, "without TLS"),
        ("192.0.2.7:7311", True, False, "accepting any client"),
        ("fd00::2:7311", False, False, "without TLS"),
        ("192.0.2.7:7311", True, True, None),
    ],
)
def test_a_leader_beyond_loopback_that_checks_no_runtime_certificate_is_warned_of(
    address: str, tls: bool, verifies: bool, warns: str | None
) -> None:
    """A leader anyone on the network can append through must say so, naming what to set."""
    warning = exposure_warning(address, tls=tls, verifies_runtimes=verifies)
    if warns is None:
        assert warning is None
    else:
        assert warning is not None and warns in warning
        assert "TOOLLEDGER_LEADER_TLS_RUNTIME_CA" in warning and address in warning
