"""`AgentRun`: drive an agent run step by step, with checkpoints, fencing and honest pauses.

A step is: ask the model; checkpoint the transcript *and the tool calls it is about to make*
(`RunCheckpointed`, compare-and-set on the run's version); make those calls through
`Ledger.call` carrying the new version; append their results to the transcript. The checkpoint
comes before any tool runs, so:

- a process that crashes mid-step is recovered from its checkpoint by `AgentRun.resume()` on
  any process: the calls of the checkpoint are made again and come back from the ledger (a
  completed call's recorded result; an unknown one is asked of its reconcile hook);
- of two processes driving one run, only the one holding the latest checkpoint can reserve
  calls (the decider rejects the other's reservations and checkpoints): it stands down with
  `RunSuperseded`, and every step has one effect.

Policies (`AgentConfig.tool_policy`) decide what the model hears, by the rules of the
call-policy layer the framework adapters share (`toolledger.runtime.policy`); this module words
them. With `on_indeterminate: pause` the model never hears "failed" while the honest answer is
"unknown": the run pauses in `awaiting_reconciliation` and, once the call is settled (reconciler
or operator), resumes with the truth; a contested call (settled failed, then evidence of an
effect arrived) pauses it the same way until an operator decides again. The duplicate-intent
guard holds a new call that repeats the tool and arguments of an unsettled call of the same
run, so a model retrying with a new call id cannot charge twice.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, assert_never

from toolledger.events.models import (
    RunCheckpointed,
    RunEvent,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
)
from toolledger.events.records import RunRecord, Verdict
from toolledger.runtime.agents import AgentConfig
from toolledger.runtime.errors import RunSuperseded
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.pipeline import identity
from toolledger.runtime.policy import Hold, drive_call
from toolledger.runtime.run_events import RunEnvelope, append_run_event, run_envelope
from toolledger.runtime.tools import Tool, Toolset

Message = dict[str, Any]
Transcript = list[Message]


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call the model asks for: its id (the tool_call_id), tool name and arguments."""

    id: str
    tool: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class FinalAnswer:
    text: str


ModelTurn = list[ToolCallRequest] | FinalAnswer
#: The model: given the transcript so far, the next tool calls or the final answer.
Model = Callable[[Transcript], Awaitable[ModelTurn]]

RunState = Literal[
    "completed", "failed", "awaiting_reconciliation", "awaiting_approval", "duplicate_intent"
]


@dataclass
class RunResult:
    """Where a run stands after `start()` or `resume()` returned."""

    run_id: str
    status: RunState
    transcript: Transcript
    answer: str | None = None
    waiting_on: str | None = None
    detail: str = ""


@dataclass
class _Pause:
    reason: Literal["awaiting_reconciliation", "awaiting_approval", "duplicate_intent"]
    key: str
    detail: str


@dataclass
class _Fail:
    detail: str


class AgentRun:
    """Drives one run of one agent. Create one per process that drives the run."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        run_id: str,
        tenant_id: str,
        agent: AgentConfig,
        tools: Iterable[Tool[Any, Any]] | Toolset,
        model: Model,
    ) -> None:
        self.ledger = ledger
        self.port = ledger.port
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.agent = agent
        self.policy = agent.tool_policy
        self.tools = {tool.name: tool for tool in tools}
        self.model = model
        self.version = 0
        self.transcript: Transcript = []

    # -- entry points ----------------------------------------------------------------------

    async def start(self, prompt: str) -> RunResult:
        """Begin the run with the user's prompt and drive it until it ends or pauses."""
        await self._append(RunStarted(**self._envelope(), agent=self.agent.name))
        self.version = 0
        self.transcript = [{"role": "user", "content": prompt}]
        await self._checkpoint([])  # the prompt survives a crash before the first answer
        return await self._drive()

    async def resume(self) -> RunResult:
        """Carry on from the run's latest checkpoint (after a crash, or when a pause is over).

        Taking over is itself a checkpoint (the same calls, the same transcript, one version
        later), so a driver that was still alive elsewhere is fenced off before anything runs.
        """
        run = await self._run_record()
        if run.version is None or run.version == 0:
            raise RunSuperseded.of_run(
                self.run_id,
                "it has no checkpoint to resume (it stopped before its prompt was saved): "
                "start a new run",
            )
        if run.status in ("completed", "failed", "cancelled"):
            return RunResult(self.run_id, _final(run.status), json.loads(run.state_json))
        self.version = run.version
        self.transcript = json.loads(run.state_json)
        if run.status != "running":
            await self._append(RunResumed(**self._envelope(), expected_version=self.version))
        if run.version > 0:
            await self._checkpoint(list(run.checkpoint_calls))
        return await self._drive()

    # -- the loop --------------------------------------------------------------------------

    async def _drive(self) -> RunResult:
        while True:
            for request in self._pending():
                stop = await self._make(request)
                if isinstance(stop, _Pause):
                    await self._append(
                        RunPaused(
                            **self._envelope(),
                            expected_version=self.version,
                            reason=stop.reason,
                            waiting_on=stop.key,
                        )
                    )
                    return RunResult(
                        self.run_id, stop.reason, self.transcript, None, stop.key, stop.detail
                    )
                if isinstance(stop, _Fail):
                    return await self._finish("failed", stop.detail)
            turn = await self.model(list(self.transcript))
            if isinstance(turn, FinalAnswer):
                self.transcript.append({"role": "assistant", "content": turn.text})
                return await self._finish("completed", turn.text)
            self.transcript.append(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": c.id, "tool": c.tool, "arguments": dict(c.arguments)} for c in turn
                    ],
                }
            )
            await self._checkpoint([c.id for c in turn])

    def _pending(self) -> list[ToolCallRequest]:
        """The last assistant turn's tool calls that have no result in the transcript yet."""
        answered = {m["tool_call_id"] for m in self.transcript if m.get("role") == "tool"}
        for message in reversed(self.transcript):
            if message.get("role") == "assistant" and "tool_calls" in message:
                return [
                    ToolCallRequest(c["id"], c["tool"], c["arguments"])
                    for c in message["tool_calls"]
                    if c["id"] not in answered
                ]
            if message.get("role") == "assistant":
                return []
        return []

    async def _make(self, request: ToolCallRequest) -> _Pause | _Fail | None:
        """Make one call (`toolledger.runtime.policy` decides) and put what the model should
        hear into the transcript."""
        tool = self.tools.get(request.tool)
        if tool is None:
            return self._error(request, f"there is no tool named {request.tool!r}")
        who = identity(tool.name, self.run_id, request.id, self.tenant_id)
        decided = await drive_call(
            self.ledger.pipeline,
            tool,
            who,
            request.arguments,
            self.policy,
            run_version=self.version,
        )
        if isinstance(decided, Hold):
            return _Pause(decided.reason, decided.waiting_on, decided.detail)
        match decided.told:
            case "same_as":
                self._answer(request, "completed", decided.result_json or "null", decided.same_as)
            case "compensated":
                said = (
                    "the call took effect and was then compensated by an operator "
                    f"({decided.detail})"
                )
                self._answer(request, "compensated", json.dumps(said))
            case "rejected":
                said = f"an operator rejected the call; it did not take effect ({decided.detail})"
                self._answer(request, "failed", json.dumps(said))
            case "settled_elsewhere":
                said = f"the call did not take effect ({decided.detail})"
                self._answer(request, "failed", json.dumps(said))
            case "refused":
                return self._error(request, decided.detail or "the call was refused")
            case "completed":
                self._answer(request, "completed", decided.result_json or "null")
            case "indeterminate":
                if self.policy.on_error == "fail_run":
                    return _Fail(f"call {request.id} ({request.tool}): {decided.detail}")
                self._answer(request, "indeterminate", json.dumps(decided.detail))
            case "failed":
                return self._error(request, f"the call failed: {decided.detail}")
            case unknown:
                assert_never(unknown)
        return None

    def _error(self, request: ToolCallRequest, detail: str) -> _Fail | None:
        if self.policy.on_error == "fail_run":
            return _Fail(f"call {request.id} ({request.tool}): {detail}")
        self._answer(request, "failed", json.dumps(detail))
        return None

    def _answer(
        self, request: ToolCallRequest, status: str, content: str, same_as: str | None = None
    ) -> None:
        message: Message = {
            "role": "tool",
            "tool_call_id": request.id,
            "status": status,
            "content": content,
        }
        if same_as is not None:
            message["same_as"] = same_as
        self.transcript.append(message)

    # -- run events ------------------------------------------------------------------------

    async def _checkpoint(self, tool_call_ids: list[str]) -> None:
        event = RunCheckpointed(
            **self._envelope(),
            expected_version=self.version,
            tool_call_ids=tuple(tool_call_ids),
            state_json=json.dumps(self.transcript, separators=(",", ":")),
        )
        verdict = await self._append(event)
        assert verdict.run is not None and verdict.run.version is not None
        self.version = verdict.run.version

    async def _finish(self, outcome: Literal["completed", "failed"], detail: str) -> RunResult:
        await self._append(
            RunFinished(
                **self._envelope(), expected_version=self.version, outcome=outcome, detail=detail
            )
        )
        answer = detail if outcome == "completed" else None
        return RunResult(self.run_id, outcome, self.transcript, answer, None, detail)

    async def _append(self, event: RunEvent) -> Verdict:
        return await append_run_event(self.port, event, self.ledger.verdict_timeout)

    async def _run_record(self) -> RunRecord:
        run = await self.port.read_run(self.run_id)
        if run is None:
            raise RunSuperseded.of_run(self.run_id, "the ledger has no such run")
        return run

    def _envelope(self) -> RunEnvelope:
        return run_envelope(self.run_id, self.tenant_id, self.ledger.clock())


def _final(status: str) -> RunState:
    return "completed" if status == "completed" else "failed"
