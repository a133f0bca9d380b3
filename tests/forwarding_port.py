"""A second adapter of the runtime port for tests: forwards to another, noting what it was asked.

It stands on no stack, so a runtime path that reached past the port fails on it, and its
`asked` list lets a test count reads and appends (one read of the key per call, say).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from toolledger.events.models import CallReserved, Event
from toolledger.events.records import CallRecord, RunRecord, Verdict
from toolledger.port import CallQuery, RuntimePort
from toolledger.runtime.forwarding import ForwardingPort


class Forwarding(ForwardingPort):
    """Another adapter of the runtime port: forwards to `inner` and notes what it was asked.
    It stands on no stack, so a runtime path that reached past the port would fail."""

    def __init__(self, inner: RuntimePort) -> None:
        super().__init__(inner)
        self.asked: list[str] = []

    async def read_call(self, key: str) -> CallRecord | None:
        self.asked.append("read_call")
        return await super().read_call(key)

    async def read_run(self, run_id: str) -> RunRecord | None:
        self.asked.append("read_run")
        return await super().read_run(run_id)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        self.asked.append("list_calls")
        return await super().list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        self.asked.append("list_runs")
        return await super().list_runs(statuses, tenant_id=tenant_id)

    async def append(self, event: Event, timeout: float) -> None:
        self.asked.append("append")
        await super().append(event, timeout)

    async def append_until_landed(self, event: Event, *, each: float, pause: float) -> None:
        self.asked.append("append_until_landed")
        await super().append_until_landed(event, each=each, pause=pause)

    async def append_and_await(self, event: Event, timeout: float) -> Verdict:
        self.asked.append("append_and_await")
        return await super().append_and_await(event, timeout)

    async def read_or_reserve(self, reserved: CallReserved, timeout: float) -> CallRecord | Verdict:
        self.asked.append("read_or_reserve")
        return await RuntimePort.read_or_reserve(self, reserved, timeout)  # notes both steps

    async def read_or_append(self, reserved: CallReserved, timeout: float) -> CallRecord | None:
        self.asked.append("read_or_append")
        return await RuntimePort.read_or_append(self, reserved, timeout)  # notes both steps

    async def await_verdict(self, event_id: uuid.UUID, timeout: float) -> Verdict:
        self.asked.append("await_verdict")
        return await super().await_verdict(event_id, timeout)
