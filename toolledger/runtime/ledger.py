"""`Ledger`: what an agent runtime calls to make a tool call take effect once.

`await ledger.call(tool, run_id=..., tool_call_id=..., tenant_id=..., arguments={...})` takes
the one road of a call (`toolledger.runtime.pipeline`): prepare the arguments, read the key
(the fast path, reading this process's own writes), replay what the ledger knows, reserve
(verdict first, or pipelined for `external(pipelined=True)`), run the tool, record its outcome
and answer. Inside the reservation's deadline an outcome returns on Kafka's acknowledgement;
later, it awaits its verdict without ever giving up and returns the ledger's truth. An outcome
that cannot be recorded at all is replaced by `indeterminate` naming why, and
`ToolResultUnrecordable` is raised at once: never a call `started` forever.

`Ledger` stands on its `RuntimePort` (`toolledger.port`) and nothing under it: pass it
any adapter. `Ledger.memory()` and `Ledger.connect()` ask the wiring (`toolledger.wiring`,
imported when they are called) for the embedded port or the Kafka and PostgreSQL one.

Large arguments and results travel by reference (`toolledger.events.payloads`); arguments
over the maximum are refused before anything is reserved (`ToolArgumentsTooLarge`).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from toolledger.events.models import utcnow
from toolledger.events.payloads import PayloadLimits
from toolledger.events.records import CallRecord, RunRecord
from toolledger.events.signing import SigningKey
from toolledger.port import CallQuery, RuntimePort, runs_of_key
from toolledger.runtime.outcome import ToolOutcome
from toolledger.runtime.pauses import resumable_runs
from toolledger.runtime.pipeline import CallPipeline, identity
from toolledger.runtime.protocol import CallProtocol, CallWaits
from toolledger.runtime.tools import Tool

if TYPE_CHECKING:
    from toolledger.settings import Settings
    from toolledger.wiring.stack import LedgerStack

T = TypeVar("T")

#: How long `close()` lets background appends (abandons, cancelled outcomes) finish.
_CLOSE_GRACE_S = 2.0


class Ledger:
    """The runtime's handle on the ledger: declares nothing, runs tools through `call()`."""

    def __init__(
        self,
        port: RuntimePort,
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
        on_close: Callable[[], Awaitable[None]] | None = None,
        embedded_signing_key: SigningKey | None = None,
    ) -> None:
        #: What the runtime reads and appends through (`AgentRun` and the adapters too).
        self.port = port
        self.embedded_signing_key = embedded_signing_key
        self.clock = clock
        self.protocol = CallProtocol(port, CallWaits.runtime(verdict_timeout), clock=clock)
        #: The one road of a call; the call-policy layer (`toolledger.runtime.policy`) uses it.
        self.pipeline = CallPipeline(self.protocol)
        self._on_close = on_close

    @classmethod
    async def memory(
        cls,
        signing_key: SigningKey | None = None,
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
        payload_limits: PayloadLimits | None = None,
    ) -> Ledger:
        """The embedded ledger: memory log, memory store, in-process projector.

        It plays every role in one process, so it keeps an operator's signing key
        (`embedded_signing_key`; without `signing_key` a fresh one is made) to sign approvals
        and resolutions that its own projector verifies. `connect()` keeps no key.
        `payload_limits` default to the settings' defaults (docs/payloads.md).
        """
        from toolledger.wiring import memory_port

        key = signing_key or SigningKey.generate(f"local-{secrets.token_hex(4)}")
        port = await memory_port(verify_keys=key.verify_keys(), limits=payload_limits)
        return cls(
            port,
            verdict_timeout=verdict_timeout,
            clock=clock,
            on_close=port.stack.close,
            embedded_signing_key=key,
        )

    @classmethod
    async def connect(
        cls,
        settings: Settings | None = None,
        *,
        run_projector: bool = False,
        clock: Callable[[], datetime] = utcnow,
    ) -> Ledger:
        """Kafka and PostgreSQL, from `settings` or the `TOOLLEDGER_*` environment.

        A bad or missing setting raises `ConfigError` naming the variable. A runtime reads the
        shared block only and holds no key (docs/security.md). Every call awaits a verdict from
        a projector, so one must be running: separate processes in production
        (`toolledger projector`), or `run_projector=True` for one in this process (tests,
        single-node setups), which then needs `TOOLLEDGER_VERIFY_KEYS`. Without a projector,
        each call is refused, not attempted, after `TOOLLEDGER_VERDICT_TIMEOUT_S`.
        """
        from toolledger.wiring import connect_port

        port, timeout = await connect_port(settings, run_projector=run_projector)
        return cls(port, verdict_timeout=timeout, clock=clock, on_close=port.stack.close)

    @classmethod
    def from_stack(
        cls,
        stack: LedgerStack,
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> Ledger:
        """A ledger on a stack the caller built and closes (tests, several runtimes on one)."""
        from toolledger.wiring import port_over

        return cls(port_over(stack), verdict_timeout=verdict_timeout, clock=clock)

    @property
    def stack(self) -> LedgerStack:
        """The stack under this ledger's port, for tests and the drill; `AttributeError` when
        the port stands on none."""
        stack: LedgerStack | None = getattr(self.port, "stack", None)
        if stack is None:
            raise AttributeError(f"this ledger's port ({type(self.port).__name__}) has no stack")
        return stack

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Let background appends finish briefly, then close what this ledger's maker handed
        it to close (the stack of `memory()` and `connect()`)."""
        await self.protocol.close(_CLOSE_GRACE_S)
        if self._on_close is not None:
            await self._on_close()

    @property
    def closing(self) -> bool:
        return self.protocol.closing

    @property
    def verdict_timeout(self) -> float:
        """How long a reservation waits for its verdict before the call is refused."""
        return self.protocol.policy.verdict_timeout

    async def read_call(self, key: str) -> CallRecord | None:
        """The key's record; `LedgerUnavailable` (nothing ran) if the store cannot be read.

        Like every read of a `Ledger`, it sees every write acknowledged before it, whichever
        process made it (`RuntimePort.fresh`, the read barrier): past the barrier's bound it
        raises `LedgerUnavailable` (a stale read) rather than answer what might be old. So a
        read right after `call` returned, here or anywhere, sees how the call ended.
        """
        await self.port.fresh(runs_of_key(key))
        return await self.pipeline.read(key, within=self.protocol.policy.verdict_timeout)

    async def read_run(self, run_id: str) -> RunRecord | None:
        """The run's record; `LedgerUnavailable` if the store cannot be read (or shown fresh)."""
        await self.port.fresh((run_id,))
        return await self.port.read_run(run_id)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching `query`; `LedgerUnavailable` if the store cannot be read (or shown
        fresh)."""
        await self.port.fresh(None if query.run_id is None else (query.run_id,))
        return await self.port.list_calls(query)

    async def list_runs(
        self, statuses: Collection[str], *, tenant_id: str | None = None
    ) -> list[RunRecord]:
        """Runs in `statuses`; `LedgerUnavailable` if the store cannot be read (or shown fresh)."""
        await self.port.fresh()
        return await self.port.list_runs(statuses, tenant_id=tenant_id)

    async def call(
        self,
        tool: Tool[Any, T],
        *,
        run_id: str,
        tool_call_id: str,
        tenant_id: str,
        arguments: Mapping[str, Any],
        run_version: int | None = None,
        warning: str | None = None,
    ) -> ToolOutcome[T]:
        """Run `tool` once for the key `<run_id>:<tool_call_id>`, or return what the ledger knows.

        `run_version` is the driver's checkpoint version (run fencing); `warning` is kept in the
        key's history with the reservation (a run driver notes an allowed duplicate intent).

        Raises `ToolCallIndeterminate` for an unknown call, and the errors of
        `toolledger.runtime.errors` for calls that cannot be made; a call that failed is
        returned as an outcome (`outcome.result()` raises `ToolCallFailed`).

        The call is an `execute_tool` span under the current one (docs/tracing.md).
        """
        who = identity(tool.name, run_id, tool_call_id, tenant_id)
        return await self.pipeline.call(
            tool, who, arguments, run_version=run_version, warning=warning
        )

    def resumable_runs(
        self, *, tenant_id: str | None = None, poll_interval: float = 0.2, follow: bool = True
    ) -> AsyncIterator[RunRecord]:
        """Paused runs whose awaited call is settled (see `toolledger.runtime.pauses`)."""
        return resumable_runs(self, tenant_id=tenant_id, poll_interval=poll_interval, follow=follow)

    async def wait_background(self, timeout: float) -> bool:
        """Wait for background appends (abandons, cancelled outcomes) to land; True if all did."""
        return await self.protocol.wait_background(timeout)
