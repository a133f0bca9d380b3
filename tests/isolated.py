"""One test's own ledger on the real services: its settings, a child's environment, its stack.

Every Kafka + PostgreSQL test builds the same few things from the session's services and the
schema and topic prefix it got to itself (`tests/conftest.py`): settings for the role it plays,
the `TOOLLEDGER_*` variables of the processes it starts, a `LedgerStack` with an in-process
projector, a `Ledger` on that stack, each closed afterwards. The `isolated` fixture hands over
an `Isolated` that builds them, so a test states only what is its own (the role, the keys, the
timeouts, a partition count other than two).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from toolledger import Ledger
from toolledger.api.app import close_stack
from toolledger.events.models import utcnow
from toolledger.settings import Settings
from toolledger.wiring.stack import LedgerStack

S = TypeVar("S", bound=Settings)

#: The partition count of a test's topics unless it says otherwise.
PARTITIONS = 2


@dataclass(frozen=True)
class Isolated:
    """The session's PostgreSQL and Kafka, narrowed to one test's schema and topic prefix."""

    database_url: str
    kafka_bootstrap: str
    schema: str
    #: Ends with the dot topic names are joined with (`t1a2b3c.toolledger.events`).
    topic_prefix: str

    def connection(self, partitions: int = PARTITIONS) -> dict[str, Any]:
        """The settings fields that put any role on this test's schema and topics."""
        return {
            "database_url": self.database_url,
            "kafka_bootstrap": self.kafka_bootstrap,
            "schema_name": self.schema,
            "topic_prefix": self.topic_prefix,
            "partitions": partitions,
        }

    def settings(self, role: type[S], *, partitions: int = PARTITIONS, **fields: Any) -> S:
        """`role`'s settings on this test's schema and topics, with `fields` of its own."""
        return role(**self.connection(partitions), **fields)


def child_env(settings: Settings) -> dict[str, str]:
    """The `TOOLLEDGER_*` variables that point a child process at `settings`' schema and topics."""
    assert settings.database_url is not None and settings.kafka_bootstrap is not None
    return {
        "TOOLLEDGER_DATABASE_URL": settings.database_url,
        "TOOLLEDGER_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOOLLEDGER_SCHEMA": settings.schema_name,
        "TOOLLEDGER_TOPIC_PREFIX": settings.topic_prefix,
        "TOOLLEDGER_PARTITIONS": str(settings.partitions),
    }


@asynccontextmanager
async def running_stack(
    settings: Settings, *, run_projector: bool = True
) -> AsyncIterator[LedgerStack]:
    """A stack on `settings` (with an in-process projector unless told otherwise), closed after.

    It creates the test's ledger schema even without a projector: a test starts its runtime
    and its projector processes in whatever order it likes (only production processes refuse a
    schema nobody built, `tests/integration/test_ledger_schema.py`)."""
    stack = await LedgerStack.connect(settings, run_projector=run_projector, create_schema=True)
    try:
        yield stack
    finally:
        await close_stack(stack)


@asynccontextmanager
async def running_ledger(
    settings: Settings,
    *,
    verdict_timeout: float = 10.0,
    clock: Callable[[], datetime] = utcnow,
) -> AsyncIterator[Ledger]:
    """A `Ledger` on a running stack on `settings` (`ledger.stack`); both closed after."""
    async with running_stack(settings) as stack:
        ledger = Ledger.from_stack(stack, verdict_timeout=verdict_timeout, clock=clock)
        try:
            yield ledger
        finally:
            await ledger.close()
