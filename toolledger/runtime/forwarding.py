"""ForwardingPort: a runtime port that hands every request to another one.

For adapters that watch or alter a few requests of a port and leave the rest alone (the drill's
kill points and verdict record, `toolledger.drill.port`; a test that counts what it was asked):
subclass it and override those methods only. It keeps the port's promises because it forwards
them: it stands on no stack of its own, and adds no waiting and no retries.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from toolledger.events.models import CallReserved, Event
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.port import CallQuery, RuntimePort


class ForwardingPort(RuntimePort):
    """`RuntimePort` forwarding everything to `inner`."""

    def __init__(self, inner: RuntimePort) -> None:
        self.inner = inner

    @property
    def limits(self) -> PayloadLimits:
        return self.inner.limits

    async def fresh(self, run_ids: Collection[str] | None = None) -> None:
        await self.inner.fresh(run_ids)

    async def read_call(self, key: str) -> CallRecord | None:
        return await self.inner.read_call(key)

    async def read_run(self, run_id: str) -> RunRecord | None:
        return await self.inner.read_run(run_id)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        return await self.inner.list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        return await self.inner.list_runs(statuses, tenant_id=tenant_id)

    async def restored_call(self, record: CallRecord) -> CallRecord:
        return await self.inner.restored_call(record)

    async def append(self, event: Event, timeout: float) -> None:
        await self.inner.append(event, timeout)

    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        await self.inner.append_until_landed(event, each=each, pause=pause)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        return await self.inner.append_and_await(event, timeout)

    async def read_or_reserve(self, reserved: CallReserved, timeout: float) -> CallRecord | Verdict:
        return await self.inner.read_or_reserve(reserved, timeout)

    async def read_or_append(self, reserved: CallReserved, timeout: float) -> CallRecord | None:
        return await self.inner.read_or_append(reserved, timeout)

    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        return await self.inner.await_verdict(event_id, timeout)

    def watch_verdict(self, event_id: uuid.UUID) -> None:
        self.inner.watch_verdict(event_id)

    def unwatch_verdict(self, event_id: uuid.UUID) -> None:
        self.inner.unwatch_verdict(event_id)
