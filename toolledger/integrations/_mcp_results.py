"""What an MCP client (and the model behind it) is told about a ledgered call.

MCP has one way to say "this did not work": a `CallToolResult` with `isError`. Clients hand its
text to the model, and a model that reads "error" tries again, under a new call id, which is a
new key and, for a refund, a second refund. And MCP has no pause: a server cannot stop the
client's run until an operator decides. So every answer of `toolledger.integrations._calls`
becomes a result whose text says what is true and what to do next, and whose `_meta` says it to
code (`dev.toolledger/key`, `dev.toolledger/status`, `dev.toolledger/waiting-on`):

| status              | isError | the model reads                                              |
|---------------------|---------|--------------------------------------------------------------|
| `completed`         | no      | the recorded result (also `structuredContent` if an object)  |
| `failed`            | yes     | it did not take effect; whether calling again may help       |
| `compensated`       | yes     | it took effect and an operator undid it                      |
| `indeterminate`     | yes     | unknown: do not retry, not even as a new call; how it settles |
| `awaiting_approval` | yes     | not run yet; the same key returns the operator's decision    |
| `held`              | yes     | a repeat of an unsettled call: not run; which key to ask     |
| `refused`           | yes     | cannot be made as sent (no key, a superseded run...)         |

Each non-completed text names the key and the way to settle it (`toolledger executions ...`,
or the operator API's `/v1/tool-executions/{key}/...`), and says that the same key, asked again
once it is settled, returns the ledger's truth.
"""

from __future__ import annotations

import json
from typing import Any, Literal
from urllib.parse import quote

import mcp.types as types

from toolledger.integrations import _mcp_keys as keys
from toolledger.integrations._calls import Answer, Pause
from toolledger.integrations._common import indeterminate_text
from toolledger.runtime import resolve_command

__all__ = [
    "answered",
    "api_path",
    "awaiting_approval",
    "held",
    "indeterminate",
    "paused",
    "refused",
    "result",
]

ResultStatus = Literal[
    "completed",
    "failed",
    "compensated",
    "indeterminate",
    "awaiting_approval",
    "held",
    "refused",
]


def result(
    text: str,
    *,
    key: str | None,
    status: ResultStatus,
    structured: Any = None,
    waiting_on: str | None = None,
) -> types.CallToolResult:
    """A tool result carrying `text` for the model and the ledger's fields in `_meta`."""
    meta: dict[str, Any] = {keys.RESULT_STATUS: status}
    if key is not None:
        meta[keys.RESULT_KEY] = key
    if waiting_on is not None:
        meta[keys.RESULT_WAITING_ON] = waiting_on
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=status != "completed",
        _meta=meta,
    )


def answered(name: str, answer: Answer) -> types.CallToolResult:
    """A settled answer (or, with `on_indeterminate="fail"`, an unknown one)."""
    if answer.status == "indeterminate":
        return indeterminate(name, answer.key)
    if answer.status != "completed":
        return result(answer.text, key=answer.key, status=answer.status)
    if answer.same_as is not None:
        return result(answer.text, key=answer.key, status="completed", waiting_on=answer.same_as)
    value = json.loads(answer.text)
    # Structured content must be a JSON object on every protocol version before 2026-07-28.
    structured = value if isinstance(value, dict) else None
    return result(answer.text, key=answer.key, status="completed", structured=structured)


def paused(name: str, pause: Pause) -> types.CallToolResult:
    """The framework adapters pause here; an MCP server can only say why, and what settles it."""
    match pause.reason:
        case "awaiting_reconciliation":
            return indeterminate(name, pause.key)
        case "awaiting_approval":
            return awaiting_approval(name, pause.key)
        case "duplicate_intent":
            return held(name, pause.key, pause.waiting_on)


def indeterminate(name: str, key: str) -> types.CallToolResult:
    """Unknown: the one answer the model must not treat as a failure to retry."""
    return result(
        f"{indeterminate_text(name, key)} Once it is settled from the other system's records "
        f"({resolve_command(key)}, or POST {api_path(key)}/resolve), calling {name} with this "
        "same key returns what really happened; until then it answers that it is unknown.",
        key=key,
        status="indeterminate",
        waiting_on=key,
    )


def awaiting_approval(name: str, key: str) -> types.CallToolResult:
    """Parked until an operator decides: MCP has no approval primitive, the ledger keeps it."""
    return result(
        f"{name} needs an operator's approval and has NOT run yet. The request is recorded "
        f"under key {key}; do not make it again as a new call. An operator approves or rejects "
        f"it (`toolledger executions approve {key} --reason ...`, or POST {api_path(key)}/approve "
        f"or /reject); calling {name} again with the same key "
        "then runs it once if it was approved, or says that it was rejected.",
        key=key,
        status="awaiting_approval",
        waiting_on=key,
    )


def held(name: str, key: str, twin: str) -> types.CallToolResult:
    """The duplicate-intent guard: a new call id repeating an unsettled call's intent."""
    return result(
        f"{name} was NOT run (key {key}): it repeats the call {twin} (same tool, same "
        "arguments), whose outcome is not known yet, so running it could do the same thing "
        f"twice. Do not retry. Once {twin} is settled ({resolve_command(twin)}), calling {name} "
        f"again with key {key} answers from it: its result if it took effect; only if it did "
        "not is this call made.",
        key=key,
        status="held",
        waiting_on=twin,
    )


def api_path(key: str) -> str:
    """The operator API's path of a call: the key percent-encoded, except its `:`, so a run id
    that `encode_run_id` gave a `%3A` arrives as itself."""
    return f"/v1/tool-executions/{quote(key, safe=':')}"


def refused(text: str, key: str | None) -> types.CallToolResult:
    """The request cannot be made as sent; nothing was reserved or run."""
    return result(text, key=key, status="refused")
