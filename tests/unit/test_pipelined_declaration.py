"""Which tools may be pipelined, decided at declaration (issue 17).

A pipelined tool may reach the other system twice, so only a tool whose duplicate request the
other system can recognise may be one: each refusal here names its reason, at the moment the
tool is declared, never at its first call.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import pipelined_tools
from toolledger import (
    PipeliningRefused,
    ReconcileOutcome,
    SideEffect,
    ToolContext,
    ToolExecutionRecord,
    ToolLedgerError,
    Toolset,
    destructive,
    external,
)
from toolledger.testing import assert_tool_contract

box = Toolset("declared")


async def look_up(record: ToolExecutionRecord, context: ToolContext) -> ReconcileOutcome:
    return ReconcileOutcome(status="unknown")


def test_an_approval_gated_tool_cannot_be_pipelined() -> None:
    """Its approval must come before anything is sent; a pipelined tool sends before the
    verdict, so the two cannot be combined."""
    with pytest.raises(PipeliningRefused, match="approval-gated external"):
        external(approval=True, pipelined=True)
    with pytest.raises(PipeliningRefused, match="approval-gated destructive"):
        destructive(pipelined=True)


@pytest.mark.parametrize("kind", ["read", "write"])
def test_only_external_and_destructive_tools_can_be_pipelined(kind: Any) -> None:
    with pytest.raises(PipeliningRefused, match=f"a {kind}\\(\\) tool cannot be pipelined"):
        SideEffect(kind, pipelined=True)


def test_a_tool_that_never_reads_its_idempotency_key_is_refused_at_declaration() -> None:
    """Without the key the other system cannot tell a pipelined duplicate from a new call."""
    with pytest.raises(PipeliningRefused) as raised:

        @box.tool(external(pipelined=True))
        async def forgets_the_key(to: str, context: ToolContext) -> str:
            return to

    message = str(raised.value)
    assert "tool declared.forgets_the_key cannot be pipelined" in message
    assert "never reads context.idempotency_key" in message
    assert isinstance(raised.value, ToolLedgerError) and raised.value.code == "pipelining_refused"


def test_a_reconcile_hook_does_not_replace_the_key() -> None:
    """A hook finds what a crashed call did; it cannot make a second request harmless."""
    with pytest.raises(PipeliningRefused, match=r"never reads context\.idempotency_key"):

        @box.tool(destructive(approval=False, pipelined=True), reconcile=look_up)
        async def hooked_but_keyless(record_id: str, context: ToolContext) -> None:
            """Reconcilable, and sends no key."""


def test_a_tool_whose_source_cannot_be_read_is_refused() -> None:
    namespace: dict[str, Any] = {"ToolContext": ToolContext}
    exec(  # noqa: S102 - a function without source, which inspect.getsource cannot show
        "async def generated(to: str, context: ToolContext) -> str:\n"
        "    return context.idempotency_key\n",
        namespace,
    )
    with pytest.raises(PipeliningRefused, match="source cannot be read"):
        box.tool(external(pipelined=True))(namespace["generated"])


def test_tools_that_pass_their_key_are_pipelined_and_keep_the_contract() -> None:
    @box.tool(destructive(approval=False, pipelined=True))
    async def delete_once(record_id: str, context: ToolContext) -> str:
        return f"deleted {record_id} under {context.idempotency_key}"

    assert delete_once.effect.pipelined and not delete_once.effect.approval
    for tool in (delete_once, *pipelined_tools.pipelined):
        assert tool.effect.pipelined
        assert_tool_contract(tool)
