"""`assert_tool_contract` and `fake_tool_context`: the helpers users put in their own CI."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fake_billing import billing
from toolledger import (
    ReconcileOutcome,
    SideEffect,
    ToolContext,
    ToolExecutionRecord,
    Toolset,
    destructive,
    external,
    read,
    write,
)
from toolledger.testing import assert_tool_contract, fake_tool_context

box = Toolset("contract")


async def look_up(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    return ReconcileOutcome(status="unknown")


@box.tool(external())
async def passes_the_key(to: str, context: ToolContext) -> str:
    return f"sent to {to} with {context.idempotency_key}"


@box.tool(destructive(), reconcile=look_up)
async def reconcilable(record_id: str, context: ToolContext) -> None:
    """Never reads the key, but a reconcile hook can look the call up."""


@box.tool(read())
async def lookup(order_id: str, context: ToolContext) -> str:
    """Reads need no key: repeating them has no effect."""
    return order_id


@box.tool(write())
async def forgets_the_key(to: str, context: ToolContext) -> str:
    return to


@box.tool(SideEffect("external", attempts=2))
async def retried_send(to: str, context: ToolContext) -> str:
    return context.idempotency_key


@box.tool(write())
async def untyped(to, context):  # type: ignore[no-untyped-def]
    return context.idempotency_key


@box.tool(write())
async def key_of_another_object(to: str, context: ToolContext) -> str:
    """Reading `.idempotency_key` of something else does not count."""
    other: Any = object()
    return str(getattr(other, "idempotency_key", to))


def test_tools_that_keep_the_contract_pass() -> None:
    for tool in (passes_the_key, reconcilable, lookup, *billing):
        assert_tool_contract(tool)


def test_a_write_with_no_key_and_no_hook_fails() -> None:
    with pytest.raises(AssertionError, match=r"never reads context\.idempotency_key"):
        assert_tool_contract(forgets_the_key)
    with pytest.raises(AssertionError, match="never reads"):
        assert_tool_contract(key_of_another_object)


def test_a_write_allowed_more_than_one_attempt_fails() -> None:
    with pytest.raises(AssertionError, match="exactly one attempt, but its side effect allows 2"):
        assert_tool_contract(retried_send)


def test_a_tool_without_type_hints_fails_with_every_problem_listed() -> None:
    with pytest.raises(AssertionError) as raised:
        assert_tool_contract(untyped)
    message = str(raised.value)
    assert message.startswith("tool contract.untyped (write) breaks the tool contract")
    assert "parameters without a type hint: to, context" in message
    assert "no return type hint" in message


def test_a_tool_whose_source_cannot_be_read_fails() -> None:
    namespace: dict[str, Any] = {"ToolContext": ToolContext}
    exec(  # noqa: S102 - a function without source, which inspect.getsource cannot show
        "async def generated(to: str, context: ToolContext) -> str:\n"
        "    return context.idempotency_key\n",
        namespace,
    )
    tool = box.tool(write())(namespace["generated"])
    with pytest.raises(AssertionError, match="source cannot be read"):
        assert_tool_contract(tool)


def test_fake_tool_context_is_what_a_tool_receives() -> None:
    context = fake_tool_context()
    assert context.idempotency_key == "test-run:test-call" and context.attempt == 1
    assert context.deadline > datetime.now(UTC) and not context.sent
    custom = fake_tool_context(run_id="r7", tool_call_id="c2", attempt=2, tenant_id="globex")
    assert (custom.idempotency_key, custom.attempt, custom.tenant_id) == ("r7:c2", 2, "globex")


async def test_sending_marks_the_context() -> None:
    context = fake_tool_context()
    async with context.sending():
        assert context.sent
    assert context.sent and "sent=True" in repr(context)


async def test_operator_takes_toolsets_in_a_list_and_refuses_what_is_not_a_tool() -> None:
    """`Operator(ledger, tools=[billing])` was taken as a tool named "billing", and the first
    `compensate` then failed asking for --tools; something that is not a tool at all must be
    refused when the Operator is built, not when a compensation needs it."""
    from toolledger import Ledger
    from toolledger.testing import Operator

    async with await Ledger.memory() as ledger:
        operator = Operator(ledger, tools=[billing])
        assert operator._compensator is not None
        assert set(operator._compensator.tools) == {tool.name for tool in billing}
        with pytest.raises(TypeError, match="tools= takes Toolsets and tools"):
            Operator(ledger, tools=[billing, print])  # type: ignore[list-item]
