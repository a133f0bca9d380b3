"""HTTP tools that know whether the request left: `ToolHTTP`, and what each ending means.

Most side-effecting tools are one HTTP request. Written by hand, each needs `context.sending()`
in the right place, the idempotency key in a header, and a decision about which httpx errors
mean "nothing left" and which "it may have happened". `ToolHTTP` does all three, the same way
for every tool:

```
payments = ToolHTTP(base_url="https://api.example.com", statuses={409: "in_progress"})

@billing.tool(external(replays_key_for=timedelta(hours=24)))
async def refund(charge: str, amount: int, context: ToolContext) -> Refund:
    answer = await payments.post("/v1/refunds", json={...}, context=context)
    return Refund.model_validate(answer.json())
```

| the request ended with                                                | recorded as           |
|-----------------------------------------------------------------------|-----------------------|
| DNS failure, connect refused or timed out, pool timeout, TLS failure  | failed, not attempted |
| write or read timeout, connection reset after the request began, 5xx  | indeterminate         |
| 4xx                                                                   | failed: status, body  |
| 2xx                                                                   | the result            |

A 4xx the server sends before it looks at a request (401, 403, 407, 408, 429: `refused`) is
failed as well, but a resend that meets one learns nothing about the first request.

Statuses can be remapped per client (`statuses={409: "in_progress"}`; outcomes `result`,
`failed`, `refused`, `in_progress`, `indeterminate`). "Indeterminate" and "in progress" are
recorded `indeterminate` for a write; a read is simply tried again (up to its 3 attempts), and a
write is never sent twice by itself (docs/architecture.md, guarantees 3 to 5). A tool declared
`external(replays_key_for=...)` has its unknown calls resent with the same key while its
downstream still replays the first answer (`toolledger.runtime.resend`).

Needs httpx (`pip install 'toolledger[http]'`); the rest of toolledger never imports this
module.
"""

from __future__ import annotations

try:
    import httpx as _httpx  # noqa: F401  (the one place that says what is missing)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "toolledger.http needs httpx: install it with `pip install 'toolledger[http]'`"
    ) from exc

from toolledger.http._client import (
    BODY_LIMIT,
    DEFAULT_KEY_HEADER,
    DEFAULT_REPLAYED_HEADER,
    DEFAULT_STATUSES,
    Outcome,
    ToolHTTP,
    outcome_of,
    sends_with_key,
)
from toolledger.http._errors import (
    RequestFailed,
    RequestInProgress,
    RequestLabel,
    RequestNotSent,
    RequestOutcomeUnknown,
    RequestRefused,
)

__all__ = [
    "BODY_LIMIT",
    "DEFAULT_KEY_HEADER",
    "DEFAULT_REPLAYED_HEADER",
    "DEFAULT_STATUSES",
    "Outcome",
    "RequestFailed",
    "RequestInProgress",
    "RequestLabel",
    "RequestNotSent",
    "RequestOutcomeUnknown",
    "RequestRefused",
    "ToolHTTP",
    "outcome_of",
    "sends_with_key",
]
