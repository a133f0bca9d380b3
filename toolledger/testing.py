"""Helpers for users' own tests: check a tool against the runtime's rules, and run it by hand.

`assert_tool_contract` exists so the rules about side effects are checked in CI, not only
written down: a tool that changes something and may run twice, or that gives the other system
no way to recognise a repeat, is a double refund waiting for its first timeout. Put one line
per tool in your test suite:

```
def test_billing_tools_keep_the_contract() -> None:
    for tool in billing:
        assert_tool_contract(tool)
```

`fake_tool_context()` builds the `ToolContext` a tool receives, so the tool's own logic can be
unit-tested by calling it directly (`await issue_credit("acct", 2500, fake_tool_context())`),
without a ledger.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timedelta
from typing import Any

from toolledger.events.models import utcnow
from toolledger.runtime.context import ToolContext
from toolledger.runtime.tools import Tool, key_passing_problem

__all__ = ["assert_tool_contract", "fake_tool_context"]


def assert_tool_contract(tool: Tool[Any, Any]) -> None:
    """Raise `AssertionError` listing every way `tool` breaks the contract; return if none.

    Exactly these checks, read from the declaration and the function's source; the tool is
    never run:

    1. **Full type hints** (every tool): every parameter of the function, `context` included,
       and its return value carry an annotation. Without them arguments are not validated and
       results are not restored to their type on replay.
    2. **One attempt** (`write()`, `external()`, `destructive()`): the declared side effect
       allows exactly one attempt (`tool.effect.attempts == 1`). The runtime never makes a
       second attempt of such a tool anyway; a declaration saying otherwise is a mistake.
    3. **A way to recognise a repeat** (`write()`, `external()`, `destructive()`): the tool has
       a reconcile hook, or its source reads `<context>.idempotency_key`, an attribute access
       on its context parameter found with `ast` in `inspect.getsource(tool.fn)`, or hands
       the context itself to a helper marked as sending the key (a `toolledger.http.ToolHTTP`
       defined at module level: `await payments.post(url, context=context)`). Reading it
       through an alias or an unmarked helper that receives the context is not seen; a tool
       whose source Python cannot show fails this check.

    Passing says the tool *can* take effect once; whether the other system honours the key
    is for a test against that system (or its fake) to show.
    """
    problems: list[str] = []
    signature = inspect.signature(tool.fn)
    unhinted = [
        name for name, p in signature.parameters.items() if p.annotation is inspect.Parameter.empty
    ]
    if unhinted:
        problems.append(f"parameters without a type hint: {', '.join(unhinted)}")
    if signature.return_annotation is inspect.Signature.empty:
        problems.append("no return type hint (results cannot be restored to their type)")
    if tool.effect.changes_something:
        context = tool.context_param.name
        if tool.effect.attempts != 1:
            problems.append(
                f"a {tool.effect.kind}() tool must allow exactly one attempt, but its side effect "
                f"allows {tool.effect.attempts}; a retried write can take effect twice"
            )
        problem = None if tool.reconcile is not None else key_passing_problem(tool.fn, context)
        if problem is not None:
            problems.append(
                f"it has no reconcile hook and {problem}: pass the key to the system it "
                "changes, or add a reconcile hook that can look the call up"
            )
    if problems:
        raise AssertionError(
            f"tool {tool.name} ({tool.effect.kind}) breaks the tool contract:\n- "
            + "\n- ".join(problems)
        )


def fake_tool_context(
    *,
    run_id: str = "test-run",
    tool_call_id: str = "test-call",
    tenant_id: str = "test-tenant",
    attempt: int = 1,
    deadline: datetime | None = None,
    tool: str = "",
    idempotency_key: str | None = None,
) -> ToolContext:
    """A `ToolContext` as the runtime would pass it (key `test-run:test-call` by default)."""
    return ToolContext(
        run_id=run_id,
        tool_call_id=tool_call_id,
        tenant_id=tenant_id,
        attempt=attempt,
        deadline=deadline if deadline is not None else utcnow() + timedelta(seconds=30),
        tool=tool,
        idempotency_key=idempotency_key,
    )
