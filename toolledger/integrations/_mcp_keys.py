"""The call key an MCP request carries in its `_meta`, read and written in one place.

MCP has no notion of a tool call id that survives a retry: the JSON-RPC request id is the
transport's, and a client that resends after a lost answer makes a new one. So the key travels
in the request's `_meta`, which the protocol leaves open to namespaced keys:

- `dev.toolledger/run-id` + `dev.toolledger/tool-call-id`: the run (an agent's conversation,
  thread or job) and the model's id of this tool call, or
- `dev.toolledger/key`: the whole key `<run_id>:<tool_call_id>`, as the ledger and the operator
  API spell it. A run id never contains `:` (`Ledger.call` refuses one), so the whole key splits
  at its first `:` and only there; a tool call id may contain `:`.

A run id with a `:` in it is refused, never split or encoded behind the client's back: the key
the operator sees must be the key the client can look up. Both forms may be sent together only
if they agree. This module is pure (no `mcp` import) so the server and the client helper, and
their tests, share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolledger import ToolLedgerError

__all__ = [
    "KEY",
    "RESULT_KEY",
    "RESULT_STATUS",
    "RESULT_WAITING_ON",
    "RUN_ID",
    "TOOL_CALL_ID",
    "KeyMetaError",
    "MetaKey",
    "checked_run_id",
    "key_from_meta",
    "meta_for",
]

RUN_ID = "dev.toolledger/run-id"
TOOL_CALL_ID = "dev.toolledger/tool-call-id"
KEY = "dev.toolledger/key"
#: On results: the key the call was made under, what the answer is (`_mcp_results` lists the
#: statuses), and the key whose settlement it waits for (itself, or the call it repeats).
RESULT_KEY = KEY
RESULT_STATUS = "dev.toolledger/status"
RESULT_WAITING_ON = "dev.toolledger/waiting-on"


class KeyMetaError(ToolLedgerError, ValueError):
    """The request's `_meta` names a key that cannot be used; nothing was reserved or run."""

    code = "key_meta"


@dataclass(frozen=True)
class MetaKey:
    """A call key read from `_meta`."""

    run_id: str
    tool_call_id: str

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.tool_call_id}"


def key_from_meta(meta: Mapping[str, Any] | None) -> MetaKey | None:
    """The key `meta` carries, None if it carries none; `KeyMetaError` if it is unusable."""
    if not meta:
        return None
    run_id = _text(meta, RUN_ID)
    tool_call_id = _text(meta, TOOL_CALL_ID)
    whole = _text(meta, KEY)
    if whole is None and run_id is None and tool_call_id is None:
        return None
    if whole is not None:
        found_run, sep, found_call = whole.partition(":")
        if not sep or not found_run or not found_call:
            raise KeyMetaError(
                f"_meta {KEY} is {whole!r}, not a key `<run_id>:<tool_call_id>`; nothing was run"
            )
        if ":" in found_call:
            raise KeyMetaError(
                f"_meta {KEY} {whole!r} holds more than one ':', so it does not say where the "
                f"run id ends. Send {RUN_ID} (without ':') and {TOOL_CALL_ID} instead. Nothing "
                "was run."
            )
        parsed = MetaKey(found_run, found_call)
        if (run_id is not None and run_id != parsed.run_id) or (
            tool_call_id is not None and tool_call_id != parsed.tool_call_id
        ):
            raise KeyMetaError(
                f"_meta {KEY} {whole!r} disagrees with {RUN_ID} {run_id!r} / {TOOL_CALL_ID} "
                f"{tool_call_id!r}; send one form, or both naming the same call. Nothing was run."
            )
        return parsed
    if run_id is None or tool_call_id is None:
        missing = RUN_ID if run_id is None else TOOL_CALL_ID
        raise KeyMetaError(
            f"_meta names a call key without {missing}: send both {RUN_ID} and {TOOL_CALL_ID} "
            f"(or the whole key as {KEY}). Nothing was run."
        )
    return MetaKey(checked_run_id(run_id), tool_call_id)


def checked_run_id(run_id: str) -> str:
    """`run_id` itself, or `KeyMetaError` if it holds the key separator `:`."""
    if ":" in run_id:
        raise KeyMetaError(
            f"run id {run_id!r} contains ':', which separates the run id from the call id in a "
            f"key, so the key {run_id}:<call id> would name another run. Use a run id without "
            "':' (replace or percent-encode it consistently, so a retry sends the same one). "
            "Nothing was run."
        )
    return run_id


def meta_for(
    *, run_id: str | None = None, tool_call_id: str | None = None, key: str | None = None
) -> dict[str, str]:
    """The `_meta` entries naming one call: a run id and a call id, or a whole key."""
    if key is not None:
        if run_id is not None or tool_call_id is not None:
            raise KeyMetaError("name the call by key, or by run_id and tool_call_id, not both")
        parsed = key_from_meta({KEY: key})
        assert parsed is not None
        return {KEY: parsed.key}
    if not run_id or not tool_call_id:
        raise KeyMetaError(
            "a keyed MCP call needs a non-empty run_id and tool_call_id (or a whole key); the "
            f"call was not sent (got run_id={run_id!r}, tool_call_id={tool_call_id!r})"
        )
    return {RUN_ID: checked_run_id(run_id), TOOL_CALL_ID: tool_call_id}


def _text(meta: Mapping[str, Any], name: str) -> str | None:
    value = meta.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise KeyMetaError(
            f"_meta {name} must be a non-empty string, not {value!r}; nothing was run"
        )
    return value
