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

`Operator` settles calls in process (resolve, approve, reject, compensate), signed and decided
exactly as over the operator API, so a test or an example needs no server, token or HTTP client
to play the human who settles what nobody can know automatically.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from toolledger.events.models import utcnow
from toolledger.events.records import CallRecord
from toolledger.events.signing import SigningKey
from toolledger.runtime.context import ToolContext
from toolledger.runtime.ledger import Ledger
from toolledger.runtime.tools import Tool, key_passing_problem
from toolledger.wiring.stack import LedgerStack

if TYPE_CHECKING:  # the operator service lives under toolledger.api, which imports FastAPI
    from toolledger.api.service import Compensation

__all__ = ["Operator", "assert_tool_contract", "fake_tool_context"]


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


# -- an operator in process ---------------------------------------------------------------------


class Operator:
    """An operator who settles calls in process, signed as the operator API signs.

    For tests and examples: what `toolledger executions resolve|approve|reject|compensate` and
    the API's `POST /v1/tool-executions/{key}/...` do, without a server, tokens or an HTTP
    client. It is the API's own `OperatorService` (the same events, signatures, compare-and-set
    and errors: `toolledger.OperatorError` with a `code`), so a test that passes with it passes
    over the API.

    ```
    async with await Ledger.memory() as ledger, Operator(ledger) as olivia:
        ...  # a run pauses on key "t1:c1"
        await olivia.resolve("t1:c1", outcome="completed", value={...}, reason="found it")
    ```

    - On the memory ledger it signs with the ledger's `embedded_signing_key` (the key its
      projector verifies); give `signing_key=` to sign with another one the ledger knows.
    - On Kafka + PostgreSQL (`Ledger.connect(...)`, `Ledger.from_stack(...)`, or a
      `LedgerStack`) it needs `signing_key=`: a private key whose public half the projectors
      verify (`TOOLLEDGER_VERIFY_KEYS`), as the API's `TOOLLEDGER_SIGNING_KEYS` would be.
    - `tenant_id` limits what it sees, as an API token does (None: every tenant, as the CLI).
    - `tools` lets it run compensations (`compensate`), as the API's `--tools` does.
    """

    def __init__(
        self,
        ledger: Ledger | LedgerStack,
        *,
        signing_key: SigningKey | None = None,
        tenant_id: str | None = None,
        name: str = "test-operator",
        tools: Iterable[Tool[Any, Any]] = (),
        verdict_timeout: float = 10.0,
    ) -> None:
        from toolledger.api.compensation import RuntimeCompensator
        from toolledger.api.service import Operator as Who
        from toolledger.api.service import OperatorService
        from toolledger.wiring.stack_port import StackPort

        stack = ledger.stack if isinstance(ledger, Ledger) else ledger
        if signing_key is None and isinstance(ledger, Ledger):
            signing_key = ledger.embedded_signing_key
        if signing_key is None:
            raise ValueError(
                "Operator needs signing_key= on a ledger that keeps no key (Kafka + PostgreSQL): "
                "a private key whose public half the projectors verify (TOOLLEDGER_VERIFY_KEYS); "
                "`toolledger dev up` prints the dev stack's"
            )
        by_name = {tool.name: tool for tool in tools}
        self._compensator = (
            RuntimeCompensator(StackPort(stack), by_name, verdict_timeout=verdict_timeout)
            if by_name
            else None
        )
        self.service = OperatorService(
            stack.store,
            stack.commands,
            signing_keys=(signing_key,),
            verdict_timeout=verdict_timeout,
            compensator=self._compensator,
        )
        self.who = Who(tenant_id, name)

    async def __aenter__(self) -> Operator:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Let a compensation's last appends land (nothing else to close: the ledger is yours)."""
        if self._compensator is not None:
            await self._compensator.close()

    async def get(self, key: str) -> CallRecord:
        """The call's record as the API shows it (`OperatorError` `not_found` if not visible)."""
        return await self.service.get(self.who, key)

    async def resolve(
        self,
        key: str,
        *,
        outcome: Literal["completed", "failed"],
        reason: str,
        value: Any = None,
        expected_version: int | None = None,
    ) -> CallRecord:
        """Settle an unknown call as `completed` (with the `value` the tool returned) or
        `failed`; the settled record."""
        return await self.service.resolve(
            self.who,
            key,
            outcome=outcome,
            reason=reason,
            value=value,
            expected_version=expected_version,
        )

    async def approve(self, key: str, *, reason: str) -> CallRecord:
        """Let a call awaiting approval run (its run then makes it, once)."""
        return await self.service.decide_approval("approve", self.who, key, reason=reason)

    async def reject(self, key: str, *, reason: str) -> CallRecord:
        """Refuse a call awaiting approval: failed, never attempted; the model hears `reason`."""
        return await self.service.decide_approval("reject", self.who, key, reason=reason)

    async def compensate(self, key: str, *, reason: str) -> Compensation:
        """Undo a completed call by running its tool's compensation once (`<key>:compensate`);
        needs the tool in `tools=`."""
        return await self.service.compensate(self.who, key, reason=reason)
