"""The one place that builds ports and stacks from settings.

The runtime (`toolledger.runtime`) talks to a `RuntimePort` and nothing else. Which adapter
sits behind it is chosen here, and only here, from what the process was given:

- `memory_port()`: the embedded ledger (memory log, memory store, an in-process projector).
  It loads neither aiokafka nor asyncpg.
- `connect_port(settings)`: Kafka and PostgreSQL: the direct path (`StackPort`), or with
  `TOOLLEDGER_LEADER=auto` the leader fast path (`StackLeaderPort`, over the direct path it
  falls back to). `toolledger.wiring.leader` says how.

Each port keeps the `LedgerStack` under it (`port.stack`), for whoever must close it. The stack's
parts live in this package too: `stack` (`LedgerStack`), `stack_port` (`StackPort`) and
`commands` (`LedgerCommands`: append, then await a durable verdict). Everything is imported
lazily, so `import toolledger` stays light and a runtime on the memory ledger never loads the
drivers it does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolledger.events.payloads import PayloadLimits
    from toolledger.events.signing import VerifyKeys
    from toolledger.settings import Settings
    from toolledger.wiring.leader import StackLeaderPort
    from toolledger.wiring.stack import LedgerStack
    from toolledger.wiring.stack_port import StackPort

__all__ = ["connect_port", "memory_port", "port_over"]


async def memory_port(
    *, verify_keys: VerifyKeys | None = None, limits: PayloadLimits | None = None
) -> StackPort:
    """The embedded ledger's port; its stack (`port.stack`) is closed by the port's owner."""
    from toolledger.wiring.stack import LedgerStack

    return port_over(await LedgerStack.memory(verify_keys=verify_keys, limits=limits))


async def connect_port(
    settings: Settings | None, *, run_projector: bool = False
) -> tuple[StackPort | StackLeaderPort, float]:
    """The port over Kafka and PostgreSQL from `settings` (None: the `TOOLLEDGER_*`
    environment, the projector's block when `run_projector`), with the verdict timeout those
    settings give. `ConfigError` names a bad or missing setting."""
    from toolledger.settings import ProjectorSettings, load_settings
    from toolledger.wiring.leader import leader_port
    from toolledger.wiring.stack import LedgerStack

    if settings is None:
        settings = load_settings(ProjectorSettings) if run_projector else load_settings()
    stack = await LedgerStack.connect(settings, run_projector=run_projector)
    return leader_port(port_over(stack), settings), settings.verdict_timeout_s


def port_over(stack: LedgerStack) -> StackPort:
    """The runtime port over a stack someone built."""
    from toolledger.wiring.stack_port import StackPort

    return StackPort(stack)
