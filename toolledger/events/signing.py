"""Operator signatures: Ed25519, a private key to sign, public keys to verify.

An operator's decision (`resolved`, `approved`, `rejected`, `compensation_requested`) is the
only kind of event a runtime must not be able to write, and runtimes can append anything to the
events topic. So the API and the operator CLI sign those events with a private key, and
projectors and replay check them with public keys. A process that can verify cannot forge:
that is why the signatures are asymmetric (an HMAC key verifies and forges alike).

Keys have ids so they can rotate. A signer holds one or more private keys and signs with the
first; a verifier holds every public key ever used, old ones forever, so any replay verifies
any log. Whether an event is accepted must depend on the log and this public key set alone,
never on which keys a process happened to have: an event signed with a key id the verifier does
not know is not rejected but stops the fold (`UnknownSigningKey`; the projector halts the
partition, like an unknown schema), and only a signature that fails against a known public key
is rejected. See docs/security.md.

Keys travel in settings as `key_id:<base64url of the raw 32 bytes>`, comma-separated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from toolledger.errors import ToolLedgerError
from toolledger.events.models import OperatorEvent, Signature

_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_Op = TypeVar("_Op", bound=OperatorEvent)


class UnknownSigningKey(ToolLedgerError):
    """An operator event names a key id this process has no public key for.

    Never a rejection: a replay holding the key would accept the event, so the verdict would
    depend on configuration. The fold stops instead; deploy the public key and restart.
    """

    code = "unknown_signing_key"

    def __init__(self, key: str, key_id: str, known: Iterable[str]) -> None:
        ids = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"operator event for {key} is signed with key id {key_id!r}, which this process "
            f"does not know (it verifies with: {ids}). Deploy keys before signers: add the "
            "public key to TOOLLEDGER_VERIFY_KEYS of every projector and replay, then restart"
        )
        self.key_id = key_id


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _raw(text: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError("the key must be the base64url encoding of 32 raw bytes")
    return raw


def _entries(text: str) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key_id, sep, value = part.partition(":")
        if not sep or not _KEY_ID.match(key_id):
            raise ValueError(
                "each entry must be key_id:base64url-key with a key id of letters, digits, "
                "'.', '_' or '-' (HMAC secrets are no longer accepted: docs/security.md)"
            )
        try:
            out.append((key_id, _raw(value.strip())))
        except ValueError as exc:
            raise ValueError(
                f"key {key_id!r}: {exc} (make one with `toolledger keys new`)"
            ) from None
    if len({key_id for key_id, _ in out}) != len(out):
        raise ValueError("a key id appears twice")
    return out


@dataclass(frozen=True)
class SigningKey:
    """A private key and its id. Its repr never shows the key."""

    key_id: str
    _private: Ed25519PrivateKey

    @classmethod
    def generate(cls, key_id: str) -> SigningKey:
        if not _KEY_ID.match(key_id):
            raise ValueError(f"key id {key_id!r} must be 1-64 letters, digits, '.', '_' or '-'")
        return cls(key_id, Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, key_id: str, seed: bytes) -> SigningKey:
        """The key whose 32 raw private bytes are `seed` (fixed keys for tests and fixtures)."""
        return cls(key_id, Ed25519PrivateKey.from_private_bytes(seed))

    def sign(self, body: bytes) -> str:
        return self._private.sign(body).hex()

    def public_bytes(self) -> bytes:
        return self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def verify_keys(self) -> VerifyKeys:
        """The public key set that verifies this key alone."""
        return VerifyKeys({self.key_id: self.public_bytes()})

    def setting(self) -> str:
        """`key_id:<private key>`, the form `TOOLLEDGER_SIGNING_KEYS` takes. A secret."""
        raw = self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return f"{self.key_id}:{_b64(raw)}"

    def public_setting(self) -> str:
        """`key_id:<public key>`, the form `TOOLLEDGER_VERIFY_KEYS` takes. Not a secret."""
        return f"{self.key_id}:{_b64(self.public_bytes())}"

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id!r}, public {fingerprint(self.public_bytes())})"


def fingerprint(public: bytes) -> str:
    """A short name for a public key, to compare key sets between processes by eye."""
    return hashlib.sha256(public).hexdigest()[:12]


class VerifyKeys:
    """Public keys by key id: what projectors and replay verify operator events with."""

    def __init__(self, keys: Mapping[str, bytes] | None = None) -> None:
        self._raw = MappingProxyType(dict(keys or {}))
        self._keys = {k: Ed25519PublicKey.from_public_bytes(v) for k, v in self._raw.items()}

    @classmethod
    def parse(cls, text: str) -> VerifyKeys:
        """From the `TOOLLEDGER_VERIFY_KEYS` form; ValueError says what is wrong."""
        return cls(dict(_entries(text)))

    @property
    def raw(self) -> Mapping[str, bytes]:
        return self._raw

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyKeys) and dict(self._raw) == dict(other._raw)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._raw.items())))

    def knows(self, key_id: str) -> bool:
        return key_id in self._keys

    def verify(self, event: OperatorEvent) -> bool:
        """Whether `event`'s signature holds; `UnknownSigningKey` for a key id not in the set."""
        assert event.signature is not None
        key = self._keys.get(event.signature.key_id)
        if key is None:
            raise UnknownSigningKey(event.key, event.signature.key_id, self._keys)
        try:
            key.verify(bytes.fromhex(event.signature.mac), event.signing_body())
        except (InvalidSignature, ValueError):
            return False
        return True

    def describe(self) -> str:
        """`k2 (3f9a...), k1 (...)`: the key ids and their public keys' fingerprints."""
        if not self._raw:
            return "no keys"
        return ", ".join(f"{k} ({fingerprint(v)})" for k, v in self._raw.items())

    def __repr__(self) -> str:
        return f"VerifyKeys({self.describe()})"


def parse_signing_keys(text: str) -> list[SigningKey]:
    """From the `TOOLLEDGER_SIGNING_KEYS` form (the first signs); ValueError says what is wrong."""
    return [SigningKey.from_seed(k, raw) for k, raw in _entries(text)]


def sign(event: _Op, key: SigningKey) -> _Op:
    """Return `event` signed by `key` (Ed25519 over `event.signing_body()`)."""
    return event.model_copy(
        update={"signature": Signature(key_id=key.key_id, mac=key.sign(event.signing_body()))}
    )


class KeySetMismatch(ToolLedgerError):
    """A projector's public keys contradict or lack keys another projector of the ledger used."""

    code = "key_set_mismatch"


def check_key_set(mine: VerifyKeys, recorded: VerifyKeys) -> None:
    """Raise `KeySetMismatch` unless `mine` holds every recorded key id with the same public key.

    Recorded keys are those earlier projectors of the ledger verified with. A key id bound to
    another public key would make two projectors judge one event differently; a missing one
    would halt a partition this projector takes over. Either way it must not start.
    """
    changed = sorted(k for k, v in recorded.raw.items() if k in mine.raw and mine.raw[k] != v)
    missing = sorted(k for k in recorded.raw if k not in mine.raw)
    problems = []
    if changed:
        problems.append(
            f"key id(s) {', '.join(changed)} have another public key than the one this ledger's "
            "projectors verified with (a key id names one key forever: use a new id)"
        )
    if missing:
        problems.append(
            f"key id(s) {', '.join(missing)}, which this ledger's projectors verified with, are "
            "missing (old public keys are kept forever: add them back)"
        )
    if problems:
        raise KeySetMismatch(
            "TOOLLEDGER_VERIFY_KEYS does not match the ledger's key set: " + "; ".join(problems)
        )
