"""Configuration from `TOOLLEDGER_*` environment variables (pydantic-settings).

A bad value stops startup with an error that names the variable, never a traceback from deep
inside a client library: `load_settings()` turns pydantic's validation error into
`ConfigError("TOOLLEDGER_PARTITIONS: ...")`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from toolledger.events.payloads import PayloadLimits

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class ConfigError(Exception):
    """A setting is missing or invalid; the message names the environment variable."""


class Settings(BaseSettings):
    """Every knob toolledger reads. The README's configuration table lists the same names."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLLEDGER_", extra="ignore", frozen=True, populate_by_name=True
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
    signing_keys: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="Operator-event HMAC keys as `key_id:secret,key_id2:secret2`; the first "
        "signs, all verify (rotation).",
    )
    fetch_wait_ms: int = Field(
        default=5, ge=0, le=10_000, description="How long a projector fetch waits for data."
    )
    batch_size: int = Field(
        default=2000, ge=1, le=100_000, description="Most events applied in one transaction."
    )
    projector_ownership: Literal["standby", "share"] = Field(
        default="standby",
        description="`standby`: the first projector takes every partition, the others wait to "
        "take over; `share`: the partitions are split evenly among the running projectors.",
    )
    identity_check_s: float = Field(
        default=2.0,
        gt=0,
        description="How often a projector re-reads the epoch markers to detect a lost log.",
    )
    verdict_timeout_s: float = Field(
        default=10.0, gt=0, description="How long a runtime waits for a reservation verdict."
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

    @field_validator("signing_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        keys: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            key_id, sep, secret = part.partition(":")
            if not sep or not key_id or len(secret) < 16:
                raise ValueError("each entry must be key_id:secret with a secret of 16+ characters")
            keys[key_id] = secret
        return keys

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}toolledger.events"

    @property
    def facts_topic(self) -> str:
        return f"{self.topic_prefix}toolledger.ledger"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}toolledger.events.dlq"

    def signing_secrets(self) -> dict[str, bytes]:
        return {k: v.encode() for k, v in self.signing_keys.items()}

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


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment (overrides win); a bad value raises `ConfigError`."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else "?"
            name = field if field.startswith("TOOLLEDGER_") else f"TOOLLEDGER_{field.upper()}"
            problems.append(f"{name}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
