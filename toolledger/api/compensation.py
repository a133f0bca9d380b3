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
3. It appends the outcome and awaits its verdict, and hands the ledger's record back; the
   service then settles the original call from it.

`load_tools` imports the modules named by `--tools` and collects their `Toolset`s and `Tool`s.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from toolledger.api.errors import Unavailable
from toolledger.api.service import COMPENSATE_SUFFIX, compensation_key
from toolledger.events.models import CallAbandoned, CallReserved, utcnow
from toolledger.events.records import CallRecord, Verdict
from toolledger.modules import ModuleLoadError, import_user_module
from toolledger.projections.commands import LedgerCommands
from toolledger.projections.verdicts import LedgerUnavailable
from toolledger.runtime.access import Envelope
from toolledger.runtime.context import ToolContext
from toolledger.runtime.executor import Attempted, CallIdentity, execute
from toolledger.runtime.recording import outcome_event
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
        effect=replace(tool.effect, approval=False, attempts=1),
        reconcile=None,
        compensation=None,
        timeout=tool.timeout,
    )
    params = list(inspect.signature(hook).parameters)
    if len(params) >= 2:
        compensating.marks_sending = uses_context_attribute(hook, params[1], "sending") is True
    return compensating


class RuntimeCompensator:
    """Runs compensations of the tools in `tools` (by name) through the runtime's executor."""

    def __init__(
        self,
        commands: LedgerCommands,
        tools: Mapping[str, Tool[Any, Any]],
        *,
        verdict_timeout: float = 10.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.commands = commands
        self.tools = dict(tools)
        self.verdict_timeout = verdict_timeout
        self.clock = clock

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

    async def run(self, record: CallRecord) -> CallRecord:
        tool = compensation_tool(self.tools[record.tool], record)
        prepared = tool.prepare(
            {"compensates": record.key, "reservation_id": str(record.reservation_id)}
        )
        who = CallIdentity(
            record.run_id,
            record.tool_call_id + COMPENSATE_SUFFIX,
            record.tenant_id,
            compensation_key(record.key),
        )
        now = self.clock()
        reserved = CallReserved(
            **self._envelope(who, now),
            tool=tool.name,
            effect=tool.effect.kind,
            args_digest=prepared.digest,
            arguments_json=prepared.arguments_json,
            deadline=now + timedelta(seconds=tool.budget),
            compensates=record.key,
        )
        verdict = await self._reserve(reserved, who)
        if not verdict.accepted:
            if verdict.call is None:
                raise Unavailable("compensation_refused", verdict.detail)
            return verdict.call  # held by another request, or already settled
        ended = await execute(tool, prepared, who, clock=self.clock)
        return await self._record(reserved, who, ended)

    async def _reserve(self, reserved: CallReserved, who: CallIdentity) -> Verdict:
        try:
            return await self.commands.append_and_await(reserved, self.verdict_timeout)
        except LedgerUnavailable as exc:
            abandon = CallAbandoned(
                **self._envelope(who, self.clock()), reservation_id=reserved.reservation_id
            )
            # Best effort: if it does not land either, the reservation may still be accepted
            # later, and the compensation is then `started` until its deadline, then resolvable.
            with contextlib.suppress(LedgerUnavailable):
                await self.commands.append(abandon, self.verdict_timeout)
            raise Unavailable(
                "ledger_unavailable",
                f"the compensation {who.key} was not run: {exc}. Ask again once the ledger "
                "answers; nothing was sent.",
            ) from exc

    async def _record(
        self, reserved: CallReserved, who: CallIdentity, ended: Attempted
    ) -> CallRecord:
        event = outcome_event(self._envelope(who, self.clock()), reserved.reservation_id, ended)
        try:
            verdict = await self.commands.append_and_await(event, self.verdict_timeout)
        except LedgerUnavailable as exc:
            raise Unavailable(
                "ledger_unavailable",
                f"the compensation {who.key} ran and its outcome ({event.type}) is in the log, "
                f"but no verdict came yet ({exc}); ask for the compensation again to finish it",
            ) from exc
        if verdict.call is None:
            raise AssertionError(f"the verdict on the outcome of {who.key} carries no record")
        return verdict.call

    @staticmethod
    def _envelope(who: CallIdentity, at: datetime) -> Envelope:
        return {
            "key": who.key,
            "run_id": who.run_id,
            "tool_call_id": who.tool_call_id,
            "tenant_id": who.tenant_id,
            "occurred_at": at,
        }
