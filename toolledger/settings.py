"""Configuration from `TOOLLEDGER_*` environment variables (pydantic-settings), per role.

Each role reads only what it needs (docs/security.md, "Roles"):

- `Settings`, the shared block every process reads: where the ledger lives (database URL,
  Kafka bootstrap, schema, topic prefix), tuning, and how a runtime reaches leaders (with TLS,
  the paths of its own certificate and key). Nothing in it is secret, which is why runtimes
  and processors, which run user code, read exactly this and no more; a runtime's TLS key
  is a file it was given, named here by its path.
- `ProjectorSettings` adds the public keys that verify operator signatures
  (`TOOLLEDGER_VERIFY_KEYS`): projectors and replay; and the leader's own TLS certificate and
  key, so the processes `toolledger server` supervises never see them.
- `OperatorSettings` adds the private signing key(s) (`TOOLLEDGER_SIGNING_KEYS`) and the metrics
  scrape token: the operator API and the CLI acting as an operator.

A class does not read the other roles' variables even when they are in its environment, so a
runtime started with the API's environment still holds no private key. A bad value stops
startup with an error that names the variable, never a traceback from deep inside a client
library: `load_settings()` turns pydantic's validation error into
`ConfigError("TOOLLEDGER_PARTITIONS: ...")`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, TypeVar, overload
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from toolledger.errors import ConfigError
from toolledger.events.payloads import PayloadLimits
from toolledger.events.signing import SigningKey, VerifyKeys, parse_signing_keys

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: The TLS settings that name PEM certificate files, and every TLS setting, of both roles.
_TLS_CERTIFICATES = (
    "runtime_tls_cert",
    "runtime_tls_leader_ca",
    "leader_tls_cert",
    "leader_tls_runtime_ca",
)
_TLS_FIELDS = (*_TLS_CERTIFICATES, "runtime_tls_key", "runtime_tls_leader_name", "leader_tls_key")
#: Listen addresses that bind every interface: nobody can connect to them as they are.
_WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 -- compared with, never bound here


def split_address(address: str) -> tuple[str, int | None]:
    """`host:port` or `host` (an IPv6 host in brackets) -> (host, port or None)."""
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        return host, int(port)
    return address, None


class Settings(BaseSettings):
    """The shared block: where the ledger lives, and tuning. Nothing secret (runtimes and
    processors read only this). The README's configuration table lists the same names."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLLEDGER_",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
        arbitrary_types_allowed=True,
    )

    database_url: str | None = Field(
        default=None, description="PostgreSQL DSN of the ledger (postgresql://user@host/db)."
    )
    kafka_bootstrap: str | None = Field(default=None, description="Kafka bootstrap servers.")
    schema_name: str = Field(
        default="toolledger",
        validation_alias="TOOLLEDGER_SCHEMA",
        description="PostgreSQL schema holding the ledger tables.",
    )
    topic_prefix: str = Field(
        default="", description="Prepended to every topic name (e.g. `staging.`)."
    )
    partitions: int = Field(
        default=12,
        ge=1,
        le=10_000,
        description="Partitions of the events topic when toolledger creates it. Never change "
        "it for an existing topic: migrate to a new topic instead.",
    )
    replication_factor: int = Field(
        default=1,
        ge=1,
        le=32,
        description="Replication factor of the topics toolledger creates (events, facts, dead "
        "letters, the processors' changelogs). 1 for a single development broker; 3 in "
        "production, which also sets min.insync.replicas=2 on the ledger's topics.",
    )
    fetch_wait_ms: int = Field(
        default=5, ge=0, le=10_000, description="How long a projector fetch waits for data."
    )
    idle_fetch_bound_ms: int = Field(
        default=500,
        ge=0,
        le=60_000,
        description="The longest a reader that finds nothing waits between fetches (0: it never "
        "backs off); an append's hint wakes it at once.",
    )
    batch_size: int = Field(
        default=2000, ge=1, le=100_000, description="Most events applied in one transaction."
    )
    projector_synchronous_commit: bool = Field(
        default=False,
        description="Whether a projector's batch waits for PostgreSQL to flush it to disk before "
        "its verdicts are announced. Off by default: the ledger is a projection of the log, and "
        "a batch lost in a database crash rolls back with its offsets and is folded again, to the "
        'same verdicts (docs/architecture.md, "Durability").',
    )
    projector_ownership: Literal["standby", "share"] = Field(
        default="standby",
        description="`standby`: the first projector takes every partition, the others wait to "
        "take over; `share`: the partitions are split evenly among the running projectors.",
    )
    owner_lease_s: float = Field(
        default=10.0,
        ge=1.0,
        le=600.0,
        description="Projectors: the lease on the partitions a projector owns. PostgreSQL ends "
        "the session holding its partition locks once it has not been renewed for this long "
        "(idle_session_timeout, PostgreSQL 14 and later), so a hung projector's partitions go "
        "to another within it; the owner renews every quarter of it.",
    )
    identity_check_s: float = Field(
        default=2.0,
        gt=0,
        description="How often a projector re-reads the epoch markers to detect a lost log.",
    )
    verdict_timeout_s: float = Field(
        default=10.0, gt=0, description="How long a runtime waits for a reservation verdict."
    )
    read_barrier_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="How long a read of the ledger (the API, the console, the CLI, processors, "
        "a runtime's lists) waits for the projection to hold every write acknowledged before "
        "it; past it the read fails as stale (503 in the API) rather than show old data.",
    )
    max_record_bytes: int = Field(
        default=1_048_576,
        ge=16_384,
        le=2**31 - 1,
        description="Largest record toolledger appends to a topic (the producer's "
        "max_request_size; the brokers' message.max.bytes must be at least this). Larger "
        "records are refused, never retried.",
    )
    payload_inline_bytes: int = Field(
        default=65_536,
        ge=1_024,
        description="Results, arguments, transcripts and operator values larger than this "
        "travel by reference (a blob in PostgreSQL); at most a quarter of "
        "TOOLLEDGER_MAX_RECORD_BYTES.",
    )
    payload_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1_024,
        le=1_000_000_000,
        description="Largest payload recorded at all; a larger result leaves its call "
        "indeterminate with an error naming the limit.",
    )
    resume_max_attempts: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Resumers: how often a paused run's resume hook may raise, with back-off "
        "between tries, before the run is marked with the error (`run_resume_failed`: the API, "
        "the console and /metrics show it) and left until a resumer starts again.",
    )
    resume_backoff_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="Resumers: seconds before a failed resume hook is called again; doubled "
        "after each failure, at most 60 times it.",
    )
    leader: Literal["auto", "off"] = Field(
        default="auto",
        description="Runtimes: `auto` (the default) sends reads, reservations, outcomes and "
        "abandons to the leader of the run's partition when one is registered (the fast path), "
        "else appends directly; `off` always appends directly.",
    )
    leader_advertise: str | None = Field(
        default=None,
        description="Projectors: the address runtimes reach the leader at, registered in "
        "PostgreSQL instead of the listen address: `host` (the port it listens on) or "
        "`host:port` (a mapped one), e.g. the service name in compose. Unset: the listen "
        "address, which then must not be a wildcard.",
    )
    leader_listen: str = Field(
        default="127.0.0.1:0",
        description="Projectors: host:port the partition leader listens on (port 0: any free "
        "one), `0.0.0.0:7311` with TOOLLEDGER_LEADER_ADVERTISE, or `off` to run no leader.",
    )
    leader_commit_linger_ms: int = Field(
        default=10,
        ge=0,
        le=100,
        description="Projectors: how long the records a partition's leader appended and "
        "answered (their runtimes wait for no commit) wait for more before they commit; other "
        "writers' records never wait; 0: every fetch commits at once.",
    )
    leader_timeout_ms: int = Field(
        default=1000,
        gt=0,
        description="Runtimes: how long a leader has to answer before a call takes the direct "
        "path (and that leader is left alone for a few seconds).",
    )
    runtime_tls_cert: Path | None = Field(
        default=None,
        description="Runtimes: PEM certificate this runtime presents to leaders (TLS); needs "
        "TOOLLEDGER_RUNTIME_TLS_KEY and TOOLLEDGER_RUNTIME_TLS_LEADER_CA.",
    )
    runtime_tls_key: Path | None = Field(
        default=None,
        validate_default=True,
        description="Runtimes: the unencrypted PEM private key of TOOLLEDGER_RUNTIME_TLS_CERT.",
    )
    runtime_tls_leader_ca: Path | None = Field(
        default=None,
        validate_default=True,
        description="Runtimes: PEM CA certificate(s) that leaders' certificates must chain to; "
        "set, every connection to a leader is TLS. Unset: plain TCP (a loopback leader).",
    )
    runtime_tls_leader_name: str | None = Field(
        default=None,
        validate_default=True,
        description="Runtimes: the DNS name checked on every leader's certificate. Unset: the "
        "IP the leader registered, which its certificate must carry as an IP address SAN.",
    )

    @field_validator("database_url")
    @classmethod
    def _database_url_ok(cls, value: str | None) -> str | None:
        """A URL asyncpg can connect with; a malformed one is a setting to fix, not an outage.
        The value is never repeated in the message: it may hold a password."""
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        example = "postgresql://user:password@host:5432/database"
        if parts.scheme not in ("postgresql", "postgres") or not value.strip().startswith(
            f"{parts.scheme}://"
        ):
            raise ValueError(f"must be a PostgreSQL URL such as {example}")
        try:
            if "," not in parts.netloc:  # asyncpg also takes host1:port1,host2:port2
                parts.port  # noqa: B018 -- parsing it is the check
        except ValueError:
            raise ValueError(f"has a port that is not a number (expected {example})") from None
        return value.strip()

    @field_validator("leader_advertise", mode="before")
    @classmethod
    def _advertise_ok(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None  # compose passes "" for an unset variable
        if isinstance(value, str):
            host, port = split_address(value.strip())
            if not host or (port is not None and not 0 < port < 65536):
                raise ValueError("must be host or host:port (e.g. server:7311, 10.0.0.5)")
            if host.strip("[]") in _WILDCARDS:
                raise ValueError(f"{host} is a wildcard: advertise an address runtimes can reach")
            return value.strip()
        return value

    @field_validator("leader_listen")
    @classmethod
    def _listen_ok(cls, value: str, info: ValidationInfo) -> str:
        host, sep, port = value.rpartition(":")
        if value != "off" and not (sep and host and port.isdigit() and int(port) < 65536):
            raise ValueError("must be host:port (e.g. 127.0.0.1:7311, port 0 for any) or off")
        if host.strip("[]") in _WILDCARDS and not info.data.get("leader_advertise"):
            raise ValueError(
                f"{host} is a wildcard; the leader registers its address in PostgreSQL for "
                "runtimes to connect to, so set TOOLLEDGER_LEADER_ADVERTISE to the address they "
                "reach it at (e.g. the service name in compose), or listen on that address"
            )
        return value

    # The TLS files of both roles, checked alike (`check_fields=False`: the leader's are
    # `ProjectorSettings` fields, which inherit these).
    @field_validator(*_TLS_FIELDS, mode="before", check_fields=False)
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty value is unset (compose passes `""` for an unset variable)."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator(*_TLS_CERTIFICATES, check_fields=False)
    @classmethod
    def _certificates(cls, path: Path | None) -> Path | None:
        if path is not None:
            from toolledger.leader.runtime_side.tls import (
                check_certificates,  # ssl, where TLS is set
            )

            check_certificates(path)
        return path

    @field_validator("runtime_tls_key", "leader_tls_key", check_fields=False)
    @classmethod
    def _key_of(cls, key: Path | None, info: ValidationInfo) -> Path | None:
        """The private key of the certificate beside it: both or neither."""
        assert info.field_name is not None
        cert_field = info.field_name.removesuffix("_key") + "_cert"
        if cert_field not in info.data:
            return key  # the certificate is invalid, and its own error says so
        cert, cert_setting = info.data[cert_field], f"TOOLLEDGER_{cert_field.upper()}"
        if cert is None and key is not None:
            raise ValueError(f"is set without {cert_setting}, the certificate it is the key of")
        if cert is not None and key is None:
            raise ValueError(f"must be set with {cert_setting} (the certificate's private key)")
        if cert is not None and key is not None:
            from toolledger.leader.runtime_side.tls import check_key

            check_key(cert, key, cert_setting)
        return key

    @field_validator("runtime_tls_leader_ca")
    @classmethod
    def _leader_ca(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        own = info.data.get("runtime_tls_cert") or info.data.get("runtime_tls_key")
        if value is None and own:
            raise ValueError(
                "must be set with TOOLLEDGER_RUNTIME_TLS_CERT: TLS to leaders is on only with "
                "the CA that verifies them, and a runtime's certificate is sent only over TLS"
            )
        return value

    @field_validator("runtime_tls_leader_name")
    @classmethod
    def _leader_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("runtime_tls_leader_ca", "") is None:
            raise ValueError("is checked only over TLS: set TOOLLEDGER_RUNTIME_TLS_LEADER_CA")
        return value

    @field_validator("schema_name")
    @classmethod
    def _schema_ok(cls, value: str) -> str:
        if not _SCHEMA_NAME.match(value):
            raise ValueError("must be a lowercase SQL identifier (letters, digits, _)")
        return value

    @field_validator("payload_inline_bytes")
    @classmethod
    def _inline_fits(cls, value: int, info: ValidationInfo) -> int:
        record = info.data.get("max_record_bytes")
        if record is not None and value * 4 > record:
            raise ValueError(
                f"must be at most a quarter of TOOLLEDGER_MAX_RECORD_BYTES ({record // 4}): an "
                "event, its verdict and its fact each carry up to three inline payloads"
            )
        return value

    @field_validator("payload_max_bytes")
    @classmethod
    def _max_above_inline(cls, value: int, info: ValidationInfo) -> int:
        inline = info.data.get("payload_inline_bytes")
        if inline is not None and value < inline:
            raise ValueError(f"must be at least TOOLLEDGER_PAYLOAD_INLINE_BYTES ({inline})")
        return value

    def payload_limits(self) -> PayloadLimits:
        return PayloadLimits(
            inline_bytes=self.payload_inline_bytes, max_bytes=self.payload_max_bytes
        )

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}toolledger.events"

    @property
    def facts_topic(self) -> str:
        return f"{self.topic_prefix}toolledger.ledger"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}toolledger.events.dlq"

    def require_services(self) -> tuple[str, str]:
        """The database URL and Kafka bootstrap, or a ConfigError naming what is missing."""
        missing = [
            name
            for name, value in (
                ("TOOLLEDGER_DATABASE_URL", self.database_url),
                ("TOOLLEDGER_KAFKA_BOOTSTRAP", self.kafka_bootstrap),
            )
            if not value
        ]
        if missing:
            raise ConfigError(
                f"{' and '.join(missing)} must be set "
                "(or run `toolledger dev up` for a local stack)"
            )
        assert self.database_url is not None and self.kafka_bootstrap is not None
        return self.database_url, self.kafka_bootstrap


class ProjectorSettings(Settings):
    """A projector's (and replay's) settings: the shared block plus the public keys."""

    verify_keys: Annotated[VerifyKeys, NoDecode] = Field(
        default_factory=VerifyKeys,
        description="Public keys that verify operator signatures, `key_id:<base64url>,...`. "
        "Every key id ever used for signing, old ones forever. Required by projectors.",
    )

    leader_tls_cert: Path | None = Field(
        default=None,
        description="Projectors: PEM certificate the leader presents to runtimes (TLS on its "
        "listener); it must carry the leader's IP as an IP address SAN, or the name runtimes "
        "check (TOOLLEDGER_RUNTIME_TLS_LEADER_NAME). Needs TOOLLEDGER_LEADER_TLS_KEY.",
    )
    leader_tls_key: Path | None = Field(
        default=None,
        validate_default=True,
        description="Projectors: the unencrypted PEM private key of TOOLLEDGER_LEADER_TLS_CERT.",
    )
    leader_tls_runtime_ca: Path | None = Field(
        default=None,
        description="Projectors: PEM CA certificate(s) runtimes' certificates must chain to; "
        "set, the leader completes a handshake only with a runtime presenting one.",
    )

    @field_validator("verify_keys", mode="before")
    @classmethod
    def _parse_verify_keys(cls, value: object) -> object:
        return VerifyKeys.parse(value) if isinstance(value, str) else value

    @field_validator("leader_tls_runtime_ca")
    @classmethod
    def _runtime_ca(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("leader_tls_cert", "") is None:
            raise ValueError(
                "needs TOOLLEDGER_LEADER_TLS_CERT and TOOLLEDGER_LEADER_TLS_KEY: a leader asks "
                "runtimes for certificates only over TLS"
            )
        return value

    def require_verify_keys(self) -> VerifyKeys:
        """The public keys, or a ConfigError naming the setting (a projector needs them)."""
        if not self.verify_keys:
            raise ConfigError(
                "TOOLLEDGER_VERIFY_KEYS must name at least one public key (key_id:base64url): "
                "a projector verifies operator decisions with them and cannot judge one "
                "without. `toolledger dev up` prints a development key set; "
                "`toolledger keys new` makes a production pair"
            )
        return self.verify_keys


class OperatorSettings(Settings):
    """The operator API's and operator CLI's settings: the shared block plus the private key."""

    signing_keys: Annotated[tuple[SigningKey, ...], NoDecode] = Field(
        default=(),
        description="Private Ed25519 keys that sign operator decisions, `key_id:<base64url>`; "
        "the first signs. Only the API and the operator CLI hold it.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token Prometheus sends to scrape the API's `/metrics`; unset: "
        "`/metrics` is not served.",
    )

    @field_validator("signing_keys", mode="before")
    @classmethod
    def _parse_signing_keys(cls, value: object) -> object:
        return tuple(parse_signing_keys(value)) if isinstance(value, str) else value

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _token_or_unset(cls, value: object) -> object:
        """An empty token is no token (compose passes `""` for an unset variable); a short
        one is refused rather than guarded by something guessable."""
        if isinstance(value, str):
            if not value.strip():
                return None
            if len(value.strip()) < 16:
                raise ValueError("must be at least 16 characters (or empty: /metrics not served)")
        return value

    def require_signing_key(self) -> SigningKey:
        """The key that signs (the first), or a ConfigError naming the setting."""
        if not self.signing_keys:
            raise ConfigError(
                "TOOLLEDGER_SIGNING_KEYS must name a private key (key_id:base64url): operator "
                "decisions are signed with the first, and projectors reject unsigned ones. "
                "`toolledger dev up` prints a development key; `toolledger keys new` makes one"
            )
        return self.signing_keys[0]


_S = TypeVar("_S", bound=Settings)


@overload
def load_settings(role: None = None, **overrides: object) -> Settings: ...
@overload
def load_settings(role: type[_S], **overrides: object) -> _S: ...
def load_settings(role: type[Settings] | None = None, **overrides: object) -> Settings:
    """`role`'s settings from the environment (overrides win); a bad value raises
    `ConfigError` naming the variable."""
    try:
        return (role or Settings)(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            name = field if field.startswith("TOOLLEDGER_") else f"TOOLLEDGER_{field.upper()}"
            problems.append(f"{name}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
