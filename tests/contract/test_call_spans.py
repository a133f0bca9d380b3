"""Every `Ledger.call` is an `execute_tool` span with its phases, on every ledger.

The SDK records into memory (`tests.tracing_support`, the `spans` fixture), the ledger is the
real one: the memory stack, and Kafka + PostgreSQL with an in-process projector. Each test names
what a trace would get wrong: a missing or misnamed attribute, a phase under the wrong parent, a
reservation that does not carry the call's context to the projector, a histogram that misses a
phase.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import REGISTRY

from tests.contract.runtime_harness import SIGNING_KEY
from tests.integration.procs import until
from tests.isolated import Isolated, running_ledger
from tests.tracing_support import Spans
from toolledger import (
    Ledger,
    LedgerUnavailable,
    ProjectorSettings,
    ToolCallIndeterminate,
    ToolContext,
    ToolNotAttemptedError,
    Toolset,
    external,
    write,
)

traced = Toolset("traced")


@traced.tool(write())
async def credit(amount_cents: int, context: ToolContext) -> int:
    """Completes; opens a span of its own, as an instrumented HTTP client would."""
    with trace.get_tracer("tests").start_as_current_span("billing POST /credits"):
        return amount_cents


@traced.tool(external())
async def lost(amount_cents: int, context: ToolContext) -> int:
    """The request may have left: the answer never came back."""
    raise ConnectionError("connection reset by peer")


@traced.tool(write())
async def refused(amount_cents: int, context: ToolContext) -> int:
    """Refuses before anything left."""
    raise ToolNotAttemptedError("account locked, nothing sent")


ARGS = {"amount_cents": 2500}
CALL = "execute_tool traced.credit"
PHASES = ["toolledger.reserve", "toolledger.tool", "toolledger.outcome"]


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


class CallSpans:
    """The claims, against whatever ledger the subclass's `ledger` fixture provides."""

    async def call(self, ledger: Ledger, tool: Any, call_id: str = "c1") -> Any:
        return await ledger.call(
            tool, run_id="r1", tool_call_id=call_id, tenant_id="acme", arguments=ARGS
        )

    async def test_a_completed_call_is_an_execute_tool_span_with_its_three_phases(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        outcome = await self.call(ledger, credit)
        assert outcome.value == 2500
        call = spans.one(CALL)
        assert call.parent is None and call.kind is SpanKind.INTERNAL
        assert attributes(call) == {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "traced.credit",
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": "c1",
            "gen_ai.conversation.id": "r1",
            "toolledger.idempotency_key": "r1:c1",
            "toolledger.effect": "write",
            "toolledger.status": "completed",
            "toolledger.replayed": False,
            "toolledger.attempt": 1,
            "toolledger.not_attempted": False,
            "toolledger.settled_by": "runtime",
        }
        assert call.status.status_code is StatusCode.UNSET
        phases = spans.children(call)
        assert [p.name for p in phases] == PHASES
        assert attributes(phases[0]) == {"toolledger.verdict": "accepted"}
        assert attributes(phases[1]) == {"toolledger.attempt": 1}
        (own,) = spans.children(phases[1])
        assert own.name == "billing POST /credits"

    async def test_the_reservation_carries_the_reserve_spans_context_to_the_projector(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        """The projector's apply must land in the call's trace, under the verdict wait."""
        await self.call(ledger, credit)
        reserve = spans.one("toolledger.reserve")
        history = await ledger.stack.store.history("r1:c1")
        reserved = json.loads(history[0].event_json)
        w3c: dict[str, str] = {}
        assert reserve.context is not None
        TraceContextTextMapPropagator().inject(
            w3c, trace.set_span_in_context(trace.NonRecordingSpan(reserve.context))
        )
        assert reserved["traceparent"] == w3c["traceparent"]
        applied = await until(
            lambda: spans.named("toolledger.apply call_reserved"),
            timeout=10,
            what="the projector's apply span",
        )
        (apply,) = applied
        assert apply.parent is not None and apply.parent.span_id == span_id(reserve)
        assert trace_id(apply) == trace_id(reserve)
        assert attributes(apply)["toolledger.idempotency_key"] == "r1:c1"
        assert attributes(apply)["toolledger.verdict"] == "accepted"
        (batch,) = [
            s for s in spans.finished() if s.name.startswith("process ")
        ]  # not the outcome's
        assert batch.kind is SpanKind.CONSUMER
        assert [link.context.span_id for link in batch.links] == [span_id(reserve)]

    async def test_a_replayed_call_says_so_and_has_no_phase(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        await self.call(ledger, credit)
        spans.clear()
        outcome = await self.call(ledger, credit)
        assert outcome.replayed
        call = spans.one(CALL)
        assert attributes(call)["toolledger.replayed"] is True
        assert attributes(call)["toolledger.status"] == "completed"
        assert "toolledger.attempt" not in attributes(call)
        assert spans.children(call) == []

    async def test_an_indeterminate_call_is_an_error_span_naming_the_status(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        with pytest.raises(ToolCallIndeterminate):
            await self.call(ledger, lost)
        call = spans.one("execute_tool traced.lost")
        got = attributes(call)
        assert got["error.type"] == "ToolCallIndeterminate"
        assert got["toolledger.status"] == "indeterminate"
        assert got["toolledger.replayed"] is False
        assert got["toolledger.not_attempted"] is False
        assert got["toolledger.attempt"] == 1
        assert call.status.status_code is StatusCode.ERROR
        tool = next(s for s in spans.children(call) if s.name == "toolledger.tool")
        assert attributes(tool)["error.type"] == "ConnectionError"

    async def test_a_call_not_attempted_says_it_is_safe_to_run_again(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        outcome = await self.call(ledger, refused)
        assert outcome.not_attempted
        got = attributes(spans.one("execute_tool traced.refused"))
        assert got["toolledger.not_attempted"] is True
        assert got["toolledger.status"] == "failed"
        assert got["toolledger.settled_by"] == "runtime"
        assert got["error.type"] == "ToolNotAttemptedError"

    async def test_a_call_refused_for_want_of_a_verdict_is_not_attempted(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        """A fail-closed refusal must read as safe to retry, not as a call that may have run."""
        assert ledger.stack.projector is not None
        ledger.stack.projector.stop()
        await ledger.stack.projector_task
        impatient = Ledger.from_stack(ledger.stack, verdict_timeout=0.3)
        with pytest.raises(LedgerUnavailable):
            await self.call(impatient, credit)
        call = spans.one(CALL)
        got = attributes(call)
        assert got["error.type"] == "LedgerUnavailable"
        assert got["toolledger.not_attempted"] is True
        assert [p.name for p in spans.children(call)] == ["toolledger.reserve"]
        await impatient.close()

    async def test_a_call_inside_a_framework_span_nests_under_it(
        self, ledger: Ledger, spans: Spans
    ) -> None:
        """A call span left at the root would float outside the agent run that made it."""
        with trace.get_tracer("tests").start_as_current_span("invoke_agent penny") as outer:
            await self.call(ledger, credit)
        call = spans.one(CALL)
        assert call.parent is not None
        assert call.parent.span_id == outer.get_span_context().span_id
        assert trace_id(call) == outer.get_span_context().trace_id

    async def test_each_phase_is_observed_in_its_histogram(self, ledger: Ledger) -> None:
        labels = {"tool": "traced.credit", "effect": "write"}
        names = ["verdict_wait", "tool", "outcome"]

        def counts() -> list[float]:
            return [
                REGISTRY.get_sample_value(f"toolledger_call_{n}_seconds_count", labels) or 0.0
                for n in names
            ]

        before = counts()
        await self.call(ledger, credit)
        assert [a - b for a, b in zip(counts(), before, strict=True)] == [1.0, 1.0, 1.0]
        await self.call(ledger, credit)  # a replay runs no phase
        assert [a - b for a, b in zip(counts(), before, strict=True)] == [1.0, 1.0, 1.0]

    async def test_without_an_sdk_the_reservation_carries_no_trace_context(
        self, ledger: Ledger
    ) -> None:
        """The no-op path must not invent a trace that nobody records."""
        await self.call(ledger, credit)
        history = await ledger.stack.store.history("r1:c1")
        assert "traceparent" not in json.loads(history[0].event_json)


class TestMemoryCallSpans(CallSpans):
    @pytest.fixture
    async def ledger(self) -> AsyncIterator[Ledger]:
        async with await Ledger.memory(verdict_timeout=5) as ledger:
            yield ledger


class TestKafkaPostgresCallSpans(CallSpans):
    @pytest.fixture
    async def ledger(self, isolated: Isolated) -> AsyncIterator[Ledger]:
        settings = isolated.settings(
            ProjectorSettings, verdict_timeout_s=5, verify_keys=SIGNING_KEY.verify_keys()
        )
        async with running_ledger(settings, verdict_timeout=5) as ledger:
            yield ledger


del CallSpans
