"""Checking what operators type before it reaches the log, and the listing cursor.

Anything an operator types ends up in an event and in PostgreSQL text columns. PostgreSQL text
holds neither NUL nor a lone surrogate, and an event the projector cannot write would stall its
whole partition, so such text is refused here, at the edge, with a message, never appended.

The listing cursor is opaque to clients: base64url of the `(updated_at, key)` of the last call
of a page, which is where the keyset query continues.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

from pydantic_core import to_jsonable_python

from toolledger.api.errors import InvalidRequest
from toolledger.events.models import canonical_json
from toolledger.events.records import CallRecord


def encode_cursor(call: CallRecord) -> str:
    """An opaque cursor that continues a listing after `call`."""
    raw = json.dumps([call.updated_at.isoformat(), call.key], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The `(updated_at, key)` a cursor continues after; `InvalidRequest` if it is not ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, key = json.loads(raw)
        when = datetime.fromisoformat(at)
        if not isinstance(key, str) or not storable(key) or when.tzinfo is None:
            raise ValueError("not a cursor")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest(
            "invalid_cursor",
            f"cursor {cursor[:40]!r} was not issued by this API; pass the next_cursor of the "
            "previous page unchanged, or omit it to start from the beginning",
        ) from None
    return when, key


def clean_reason(reason: str) -> str:
    """The reason without surrounding whitespace; `InvalidRequest` if nothing is left."""
    cleaned = reason.strip()
    if not cleaned:
        raise InvalidRequest(
            "reason_required",
            "a decision needs a reason: say what you checked (e.g. 'credit cr_81 found in the "
            "billing console')",
        )
    if not storable(cleaned):
        raise InvalidRequest(
            "invalid_reason", "the reason must be UTF-8 text without NUL characters"
        )
    return cleaned


def storable(text: str) -> bool:
    """Whether the ledger can store `text`: UTF-8 encodable and free of NUL (PostgreSQL text
    holds neither a lone surrogate nor NUL, and an event the projector cannot write would
    stall its partition)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def value_json(value: Any) -> str | None:
    """A resolution's value as stored JSON; `InvalidRequest` if JSON cannot hold it.

    The value is what the tool would have returned, so it is turned into JSON as a tool's
    result is (pydantic's JSON form, `Tool.dump_result`): a dataclass or a pydantic model is
    its fields, a datetime ISO text, and it reads back into the tool's declared return type.
    """
    if value is None:
        return None
    try:
        value = to_jsonable_python(value)
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError) as exc:  # PydanticSerializationError is a ValueError
        raise InvalidRequest(
            "invalid_value",
            f"value is not JSON, a dataclass or a pydantic model ({exc})",
        ) from None
    text = canonical_json(value)  # JSON escapes NUL, so only a lone surrogate can fail here
    if not storable(text):
        raise InvalidRequest("invalid_value", "value must be UTF-8 text")
    return text
