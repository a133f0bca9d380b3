"""Running a tool's compensation as its own ledgered call, with the runtime's executor.

Guarantee 7: compensation runs only when an operator asks, and it is itself a ledgered call,
key `<key>:compensate`, so it cannot run twice either. `RuntimeCompensator` is the
`toolledger.api.service.Compensator` that does it:

1. It reserves `<run_id>:<tool_call_id>:compensate` with `compensates=<key>` (an operator's call,
   so the decider exempts it from run fencing). Its arguments name the call and the reservation
   it undoes, so a second request for the same call is the same call: the ledger returns the
   recorded outcome or refuses while another process holds it, and the hook never runs twice.
2. It runs the tool's compensation hook through `toolledger.runtime.executor.execute`, as a
   one-attempt call of the tool's own effect kind: a timeout after the hook may have sent its
   request is `indeterminate` (settled later by an operator resolving `<key>:compensate`), and a
   hook that marks `context.sending()` gets "not attempted" for errors before it, exactly like a
   tool.
3. It appends the outcome until it lands and awaits its verdict, at most the verdict timeout
   (a request's `CallWaits`), and hands the ledger's record back; the service then settles the
   original call from it.

It is the runtime's one call pipeline (`toolledger.runtime.pipeline`) with a request's wait
policy: a reservation whose verdict does not come is abandoned until the abandon lands, a
held compensation is awaited (bounded) like any call held by another holder, exactly as for an
agent's call; only mapping the answer to the record the service needs is this module's.

`load_tools` imports the modules named by `--tools` and collects their `Toolset`s and `Tool`s.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from toolledger.api.errors import Unavailable
from toolledger.api.service import COMPENSATE_SUFFIX, compensation_key
from toolledger.errors import LedgerUnavailable
from toolledger.events.models import utcnow
from toolledger.events.records import CallRecord
from toolledger.modules import ModuleLoadError, import_user_module
from toolledger.port import RuntimePort
from toolledger.runtime.context import ToolContext
from toolledger.runtime.errors import ToolCallError, ToolCallIndeterminate, ToolCallInProgress
from toolledger.runtime.executor import CallIdentity
from toolledger.runtime.pipeline import CallPipeline
from toolledger.runtime.protocol import CallProtocol, CallWaits, OutcomeVerdictPending
from toolledger.runtime.tools import Tool, Toolset, uses_context_attribute


def load_tools(modules: Iterable[str]) -> dict[str, Tool[Any, Any]]:
    """Every tool declared at the top level of `modules` (as a `Toolset` or a `Tool`), by name.

    The working directory is importable, as for `python -m` and uvicorn, so `--tools
    mypkg.tools` finds a project's own package without installing it.
    """
    tools: dict[str, Tool[Any, Any]] = {}
    for name in modules:
        module = import_user_module(name, "--tools")
        found = 0
        for value in vars(module).values():
            declared = list(value) if isinstance(value, Toolset) else [value]
            for tool in declared:
                if isinstance(tool, Tool):
                    tools[tool.name] = tool
                    found += 1
        if not found:
            raise ModuleLoadError(f"--tools {name}: the module declares no Toolset or Tool")
    return tools


def compensation_tool(tool: Tool[Any, Any], record: CallRecord) -> Tool[Any, Any]:
    """A one-attempt tool that runs `tool`'s compensation hook on `record`."""
    hook = tool.compensation
    if hook is None:
        raise ValueError(f"tool {tool.name} declares no compensation")

    async def compensate(compensates: str, reservation_id: str, context: ToolContext) -> Any:
        return await hook(record, context)

    compensating = Tool(
        compensate,
        name=tool.name + COMPENSATE_SUFFIX,
        effect=replace(
            tool.effect, approval=False, attempts=1, pipelined=False, replays_key_for=None
        ),
        reconcile=None,
        compensation=None,
        timeout=tool.timeout,
    )
    params = list(inspect.signature(hook).parameters)
    if len(params) >= 2:
        compensating.marks_sending = uses_context_attribute(hook, params[1], "sending") is True
    return compensating


class RuntimeCompensator:
    """Runs compensations of the tools in `tools` (by name) down the one call pipeline.

    Its `CallWaits` is a request's: the reservation's verdict and the outcome's are each
    awaited at most `verdict_timeout` (an operator's request cannot wait forever), and the
    outcome's verdict is always awaited, since the service settles the original call from the
    ledger's record of the compensation. The abandon of an unanswered reservation and the
    outcome are appended until they land, in the background; `close()` gives those a moment
    before the process stops.
    """

    def __init__(
        self,
        port: RuntimePort,
        tools: Mapping[str, Tool[Any, Any]],
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.tools = dict(tools)
        self.protocol = CallProtocol(port, CallWaits.request(verdict_timeout), clock=clock)
        self.pipeline = CallPipeline(self.protocol)

    def unavailable(self, record: CallRecord) -> str | None:
        tool = self.tools.get(record.tool)
        if tool is None:
            return (
                f"it ran tool {record.tool}, which this process does not know; start it with "
                f"--tools naming the module that declares {record.tool}"
            )
        if tool.compensation is None:
            return f"tool {record.tool} declares no compensation, so there is nothing to run"
        if not tool.effect.changes_something:
            return f"tool {record.tool} is a read; it had no effect to undo"
        return None

    async def run(self, record: CallRecord, known: CallRecord | None = None) -> CallRecord:
        tool = compensation_tool(self.tools[record.tool], record)
        who = CallIdentity(
            record.run_id,
            record.tool_call_id + COMPENSATE_SUFFIX,
            record.tenant_id,
            compensation_key(record.key),
        )
        arguments = {"compensates": record.key, "reservation_id": str(record.reservation_id)}
        try:
            outcome = await self.pipeline.call(
                tool, who, arguments, compensates=record.key, record=known
            )
        except OutcomeVerdictPending as exc:
            raise Unavailable(
                "ledger_unavailable",
                f"the compensation {who.key} ran, but its outcome has no verdict yet ({exc}); "
                "ask for the compensation again to finish it",
            ) from exc
        except LedgerUnavailable as exc:
            raise Unavailable(
                "ledger_unavailable",
                f"the compensation {who.key} was not run, nothing was sent ({exc}); ask again "
                "once the ledger answers",
            ) from exc
        except ToolCallIndeterminate as exc:
            unknown: CallRecord = exc.record
            return unknown  # unknown: an operator resolves `<key>:compensate`
        except ToolCallInProgress:
            return await self._current(who.key)  # another request holds it, still running
        except ToolCallError as exc:
            raise Unavailable("compensation_refused", str(exc)) from exc
        return outcome.record or await self._current(who.key)

    async def _current(self, key: str) -> CallRecord:
        found = await self.pipeline.read(key, within=self.protocol.policy.verdict_timeout)
        if found is None:
            raise AssertionError(f"the ledger has no record of the compensation {key}")
        return found

    async def close(self, grace: float = 2.0) -> None:
        """Let the abandons and outcomes still being appended land for `grace` seconds."""
        await self.protocol.close(grace)
