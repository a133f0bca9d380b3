"""Framework adapters: each adapter's own cost per call, vs a bare `Ledger.call` of that tool.

What a framework hook adds on top of the ledger is what this measures, on the memory ledger
(where the ledger itself is cheapest, so the adapter's share is the largest): each adapter's
hook called the way its framework calls it, with the objects the framework would pass (a
LangGraph `ToolCallRequest` with a `ToolRuntime`; a PydanticAI `RunContext`; the OpenAI Agents
SDK's `needs_approval` then `on_invoke_tool` with a `ToolContext`), against `ledger.call` of the
same external no-op tool, in the same ledger, alternating call by call. Every call is a new key
of a new run, so each one reserves, runs and records: the adapter's extra work is the read of
the key before the call (a call an operator settled must not be reserved again), the
duplicate-intent query of the run's calls (a non-read tool), the key and name mapping and the
framework's result object. The framework's own loop around the hook (graph steps, the agent
run, the model) is not the adapter's cost and is left out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks._runtime import bench, noop
from benchmarks._support import Row, median, say
from toolledger import Ledger

WARMUP = 50
#: Builds the framework's objects for one call (not timed: the framework makes them anyway)
#: and returns the awaitable of the adapter's hook, which is timed.
Hook = Callable[[str, int], Awaitable[Any]]


async def _langgraph(ledger: Ledger) -> Hook:
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime

    from toolledger.integrations.langgraph import LangGraphTools

    tools = LangGraphTools(ledger, bench, tenant_id="bench")
    shell = tools.tools[0]

    async def never(request: ToolCallRequest) -> ToolMessage:
        raise AssertionError("a ledger tool must not reach ToolNode's execute")

    def call(run: str, n: int) -> Awaitable[Any]:
        runtime: ToolRuntime[Any, Any] = ToolRuntime(
            state={},
            context=None,
            config={"configurable": {"thread_id": run}},
            stream_writer=lambda _: None,
            tool_call_id="c1",
            store=None,
        )
        request = ToolCallRequest(
            tool_call={"name": shell.name, "args": {"n": n}, "id": "c1", "type": "tool_call"},
            tool=shell,
            state={},
            runtime=runtime,
        )
        return tools.awrap_tool_call(request, never)

    return call


async def _pydantic_ai(ledger: Ledger) -> Hook:
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    from toolledger.integrations.pydantic_ai import LedgerToolset

    toolset = LedgerToolset(ledger, bench, tenant_id="bench")
    model = TestModel()
    # pydantic-ai lists a toolset's tools once per run step, not per call.
    step = RunContext(deps=None, model=model, usage=RunUsage())
    tools = await toolset.get_tools(step)
    name = next(iter(tools))

    def call(run: str, n: int) -> Awaitable[Any]:
        ctx = RunContext(
            deps=None, model=model, usage=RunUsage(), conversation_id=run, tool_call_id="c1"
        )
        return toolset.call_tool(name, {"n": n}, ctx, tools[name])

    return call


async def _openai_agents(ledger: Ledger) -> Hook:
    import json

    from agents import FunctionTool, RunContextWrapper
    from agents.tool_context import ToolContext

    from toolledger.integrations.openai_agents import OpenAIAgentsTools

    tools = OpenAIAgentsTools(ledger, bench, tenant_id="bench")
    tool = tools.tools[0]
    assert isinstance(tool, FunctionTool) and callable(tool.needs_approval)
    needs_approval = tool.needs_approval

    def call(run: str, n: int) -> Awaitable[Any]:
        context = {"run_id": run}
        wrapper = RunContextWrapper(context)
        arguments = json.dumps({"n": n})
        tool_context = ToolContext(
            context, tool_name=tool.name, tool_call_id="c1", tool_arguments=arguments
        )

        async def invoke() -> Any:
            if await needs_approval(wrapper, {"n": n}, "c1"):
                raise AssertionError("a completed call must not pause the run")
            return await tool.on_invoke_tool(tool_context, arguments)

        return invoke()

    return call


HOOKS: dict[str, Callable[[Ledger], Awaitable[Hook]]] = {
    "langgraph": _langgraph,
    "pydantic_ai": _pydantic_ai,
    "openai_agents": _openai_agents,
}


class _InnerCalls:
    """Wraps `ledger.call` for the adapters, adding up the CPU time spent inside it, so the
    adapter's own share of a hook (everything but the ledger call it makes) is measured."""

    def __init__(self, ledger: Ledger) -> None:
        self.cpu = 0.0
        self.bare = ledger.call

        async def call(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return await self.bare(*args, **kwargs)
            finally:
                self.cpu += time.process_time() - started

        ledger.call = call  # type: ignore[method-assign]


async def _folded(ledger: Ledger, key: str) -> None:
    """Wait (untimed) until the projector folded the call's outcome: an outcome returns on the
    log's acknowledgement, and its folding must not be billed to whichever call comes next."""
    while True:
        record = await ledger.read_call(key)
        if record is not None and record.status == "completed":
            return
        await asyncio.sleep(0)


async def _timed(work: Awaitable[Any]) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    await work
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(*, samples: int, repeat: int) -> list[Row]:
    rows: list[Row] = []
    for framework, build in HOOKS.items():
        bare_medians: list[float] = []
        hook_medians: list[float] = []
        bare_cpu: list[float] = []
        hook_cpu: list[float] = []
        own_cpu: list[float] = []
        for rep in range(repeat):
            async with await Ledger.memory() as ledger:
                inner = _InnerCalls(ledger)
                hook = await build(ledger)
                for n in range(WARMUP):
                    await inner.bare(
                        noop,
                        run_id=f"wb{n}",
                        tool_call_id="c1",
                        tenant_id="bench",
                        arguments={"n": n},
                    )
                    await hook(f"wh{n}", n)
                bare: list[tuple[float, float]] = []
                adapted: list[tuple[float, float]] = []
                own: list[float] = []
                for n in range(samples):
                    bare.append(
                        await _timed(
                            inner.bare(
                                noop,
                                run_id=f"b{n}",
                                tool_call_id="c1",
                                tenant_id="bench",
                                arguments={"n": n},
                            )
                        )
                    )
                    await _folded(ledger, f"b{n}:c1")
                    inside = inner.cpu
                    adapted.append(await _timed(hook(f"h{n}", n)))
                    own.append(adapted[-1][1] - (inner.cpu - inside))
                    await _folded(ledger, f"h{n}:c1")
            bare_medians.append(median([w for w, _ in bare]) * 1e6)
            hook_medians.append(median([w for w, _ in adapted]) * 1e6)
            bare_cpu.append(median([c for _, c in bare]) * 1e6)
            hook_cpu.append(median([c for _, c in adapted]) * 1e6)
            own_cpu.append(median(own) * 1e6)
            say(
                f"  {framework} {rep + 1}/{repeat}: adapter p50 {hook_medians[-1]:.1f} us "
                f"({hook_cpu[-1]:.1f} us CPU), bare Ledger.call p50 {bare_medians[-1]:.1f} us "
                f"({bare_cpu[-1]:.1f} us CPU); the adapter's own CPU {own_cpu[-1]:.1f} us"
            )
        value, floor = median(hook_medians), median(bare_medians)
        cpu, cpu_floor = median(hook_cpu), median(bare_cpu)
        note = (
            f"{samples} calls each x {repeat} repetitions (fresh memory ledger each), adapter "
            "and bare calls alternating, every call a new key; medians of per-repetition medians"
        )
        name = f"{framework} adapter per call"
        rows.append(Row(name, "p50 wall", value, "us", floor, "bare Ledger.call", "", note))
        rows.append(Row(name, "p50 CPU", cpu, "us", cpu_floor, "bare Ledger.call", "<= 1.2x"))
        rows.append(Row(name, "own CPU", median(own_cpu), "us", None, "", "< 50 us"))
    return rows


if __name__ == "__main__":  # no services needed: `python -m benchmarks.integrations`
    from benchmarks._support import table

    print(table(asyncio.run(measure(samples=300, repeat=3))))
