"""ToolContext: what a tool knows about the call it is running, and how it says "sending now".

The idempotency key is the point of the whole library: `<run_id>:<tool_call_id>`, unique to one
call of one run and stable across every replay of it. A tool that changes something passes it
downstream (an `Idempotency-Key` header, a metadata field), so the other system can recognise a
repeat; it is deliberately not derived from the arguments, because two calls with equal
arguments can be two real effects.

`sending()` marks the moment a request may leave. The runtime cannot see the network, so the
tool tells it: an error raised before `sending()` was entered means nothing left and the call is
`failed`, not attempted, safe to run again; an error once it was entered may have reached the
other system and, for anything but a read, makes the call `indeterminate`. A tool whose code
never mentions `context.sending()` gives the runtime no such mark and is treated as if it were
sending from its first line (see `toolledger.runtime.tools`). A helper that sees the wire
(`toolledger.http`) calls `mark_sending()` at the moment the request's first byte goes out, and
notes what the other system answered in `evidence`, which a resend of the call
(`toolledger.runtime.resend`) records in the ledger.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from toolledger.events.models import call_key


class ToolContext:
    """The call a tool runs for: its key, run, tenant, attempt number and deadline.

    One context is made per attempt, so `attempt` (1-based) and `sent` describe this attempt
    only. `deadline` is when the runtime stops waiting for this attempt (UTC); a tool passes it
    on as a request timeout where the other system accepts one.
    """

    __slots__ = (
        "_sent",
        "attempt",
        "deadline",
        "evidence",
        "idempotency_key",
        "run_id",
        "tenant_id",
        "tool",
        "tool_call_id",
    )

    def __init__(
        self,
        *,
        run_id: str,
        tool_call_id: str,
        tenant_id: str,
        attempt: int,
        deadline: datetime,
        tool: str = "",
        idempotency_key: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.tenant_id = tenant_id
        self.attempt = attempt
        self.deadline = deadline
        self.tool = tool
        self.idempotency_key = idempotency_key or call_key(run_id, tool_call_id)
        self._sent = False
        #: What this attempt saw of the other system, one line each ("POST .../refunds -> 200").
        self.evidence: list[str] = []

    @property
    def sent(self) -> bool:
        """Whether this attempt entered `sending()`: a request may have left."""
        return self._sent

    @contextlib.asynccontextmanager
    async def sending(self) -> AsyncIterator[None]:
        """Wrap the code that sends the request; everything before it is "not attempted".

        ```
        token = await auth.refresh()          # fails here: failed, not attempted
        async with context.sending():
            await client.credit(..., idempotency_key=context.idempotency_key)
        ```

        The mark stays once set: leaving the block does not make later errors "not sent".
        """
        self.mark_sending()
        yield

    def mark_sending(self) -> None:
        """The request starts to leave now: what entering `sending()` does, for a helper that
        sees the moment itself (an HTTP transport hook) rather than wrapping a block."""
        self._sent = True

    def __repr__(self) -> str:
        return (
            f"ToolContext(idempotency_key={self.idempotency_key!r}, tenant_id={self.tenant_id!r},"
            f" attempt={self.attempt}, deadline={self.deadline.isoformat()}, sent={self._sent})"
        )
