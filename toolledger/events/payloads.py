"""Large payloads travel by reference: which fields may, and how an event sheds and regains them.

Kafka refuses a record over its request size (1 MiB by default), and an event carries text of
any size: a tool's result, a call's arguments, a run's transcript, an operator's value. So
before an event is appended, every such field longer than the inline threshold is *offloaded*:
its text goes to the ledger store as a content-addressed blob (SHA-256 of the UTF-8 text), and
the event carries the digest in the field's `*_blob` twin, with the text field left empty
(`""`, which no JSON reader mistakes for a value). The blob is written before the event that
names it is appended, so no event in the log names a blob that was never stored.

The shape follows temporal's external storage (`temporalio/converter/_extstore.py`): a
reference replaces the payload in the durable history, and the payload is fetched back when
someone reads it. What that gives here:

- The decider stays a pure function of the log. It copies references into the records the way
  it copies text (`CallRecord.result_blob`, `RunRecord.state_blob`), and never reads a blob, so
  a replay folds to the same records, history and digest without the blob store.
- The history keeps the event as logged, so each entry's chain hash covers the digest, and the
  digest covers the text: altering a blob is caught by re-hashing it (`restore` does).
- Verdicts, facts and notifications stay small: they carry references too.
- Readers (the runtime, the API, the CLI, audit) call `restore_call` / `restore_run` /
  `restore_event` with the blobs from the store, and see the text as if it had been inline.

A payload over the maximum cannot be recorded at all: `PayloadTooLarge` names the key, the
field, the size and the limit. This module does no I/O; the store adapters keep the blobs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from toolledger.errors import ToolLedgerError
from toolledger.events.models import (
    CallCompleted,
    CallReserved,
    CallResolved,
    Event,
    RunCheckpointed,
)
from toolledger.events.records import CallRecord, RunRecord

#: Text fields that may travel by reference, per event type: (text field, digest field).
OFFLOADABLE: dict[type[Event], tuple[tuple[str, str], ...]] = {
    CallReserved: (("arguments_json", "arguments_blob"),),
    CallCompleted: (("result_json", "result_blob"),),
    CallResolved: (("value_json", "value_blob"),),
    RunCheckpointed: (("state_json", "state_blob"),),
}
_CALL_FIELDS = (("arguments_json", "arguments_blob"), ("result_json", "result_blob"))
_RUN_FIELDS = (("state_json", "state_blob"),)

#: Default inline threshold: text up to this many UTF-8 bytes stays in the event.
DEFAULT_INLINE_BYTES = 64 * 1024
#: Default maximum: the largest payload toolledger records at all.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Free text that is never offloaded (errors, details) is cut to this many characters.
MAX_TEXT_CHARS = 8 * 1024

_WHAT = {
    "arguments_json": "arguments",
    "result_json": "result",
    "value_json": "resolved value",
    "state_json": "transcript",
}

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class PayloadLimits:
    """When a payload goes by reference (`inline_bytes`) and the most recorded (`max_bytes`)."""

    inline_bytes: int = DEFAULT_INLINE_BYTES
    max_bytes: int = DEFAULT_MAX_BYTES


class PayloadError(ToolLedgerError):
    """A payload could not be recorded or read back; the message says which and what to do."""

    code = "payload_error"


class PayloadTooLarge(PayloadError, ValueError):
    """A payload over the maximum: it cannot be recorded, by reference or otherwise."""

    code = "payload_too_large"

    def __init__(self, key: str, field: str, size: int, limit: int) -> None:
        what = _WHAT.get(field, field)
        super().__init__(
            f"the {what} of {key} is {size} bytes, more than the {limit} bytes toolledger "
            f"records (setting TOOLLEDGER_PAYLOAD_MAX_BYTES); it was not recorded"
        )
        self.key = key
        self.field = field
        self.size = size
        self.limit = limit


class PayloadRefused(PayloadError):
    """The ledger store refused to keep a payload (not unreachable: it answered no)."""

    code = "payload_refused"

    def __init__(self, key: str, size: int, why: str) -> None:
        super().__init__(
            f"the ledger store refused the {size}-byte payload of {key} ({why}); it was not "
            "recorded"
        )
        self.key = key
        self.size = size


class PayloadUnavailable(PayloadError):
    """A referenced blob is missing from the store or does not match its digest."""

    code = "payload_unavailable"


def digest_of(data: bytes) -> str:
    """The reference of a blob: SHA-256 of its bytes, as hex."""
    return hashlib.sha256(data).hexdigest()


def offload(event: E, limits: PayloadLimits) -> tuple[E, dict[str, bytes]]:
    """`event` with every offloadable field over the threshold replaced by its digest, and the
    blobs to store first (digest -> bytes). An event with nothing to offload comes back as is.

    Raises `PayloadTooLarge` for a field over the maximum.
    """
    changes: dict[str, str] = {}
    blobs: dict[str, bytes] = {}
    for text_field, blob_field in OFFLOADABLE.get(type(event), ()):
        text = getattr(event, text_field)
        if text is None or getattr(event, blob_field) is not None:
            continue
        data = text.encode()
        if len(data) <= limits.inline_bytes:
            continue
        if len(data) > limits.max_bytes:
            raise PayloadTooLarge(event.key, text_field, len(data), limits.max_bytes)
        digest = digest_of(data)
        blobs[digest] = data
        changes |= {text_field: "", blob_field: digest}
    if not changes:
        return event, {}
    return event.model_copy(update=changes), blobs


def offloaded_size(event: Event) -> int:
    """UTF-8 bytes of the offloadable text an event still carries inline (for the checks)."""
    total = 0
    for text_field, _ in OFFLOADABLE.get(type(event), ()):
        text = getattr(event, text_field)
        total += len(text.encode()) if text else 0
    return total


def event_blobs(event: Event) -> list[str]:
    """The digests an event references."""
    return [
        digest
        for _, blob_field in OFFLOADABLE.get(type(event), ())
        if (digest := getattr(event, blob_field)) is not None
    ]


def call_blobs(call: CallRecord) -> list[str]:
    return [d for _, f in _CALL_FIELDS if (d := getattr(call, f)) is not None]


def run_blobs(run: RunRecord) -> list[str]:
    return [d for _, f in _RUN_FIELDS if (d := getattr(run, f)) is not None]


def restore_event(event: E, blobs: Mapping[str, bytes]) -> E:
    """`event` with its referenced texts back in place (the digests stay, for who wants them)."""
    restored = _restore(event, OFFLOADABLE.get(type(event), ()), blobs)
    assert isinstance(restored, type(event))
    return restored


def restore_call(call: CallRecord, blobs: Mapping[str, bytes]) -> CallRecord:
    """The record with its arguments and result text back in place."""
    return _restore(call, _CALL_FIELDS, blobs)


def restore_run(run: RunRecord, blobs: Mapping[str, bytes]) -> RunRecord:
    """The run with its transcript text back in place."""
    return _restore(run, _RUN_FIELDS, blobs)


_M = TypeVar("_M", Event, CallRecord, RunRecord)


def _restore(model: _M, fields: Iterable[tuple[str, str]], blobs: Mapping[str, bytes]) -> _M:
    changes: dict[str, str] = {}
    for text_field, blob_field in fields:
        digest = getattr(model, blob_field)
        if digest is None:
            continue
        data = blobs.get(digest)
        key = getattr(model, "key", None) or getattr(model, "run_id", "?")
        if data is None:
            raise PayloadUnavailable(
                f"the {_WHAT.get(text_field, text_field)} of {key} is stored by reference "
                f"(blob {digest}), and the ledger store has no such blob: restore the "
                "payload_blobs table from a backup (the log holds only the digest)"
            )
        if digest_of(data) != digest:
            raise PayloadUnavailable(
                f"blob {digest} (the {_WHAT.get(text_field, text_field)} of {key}) does not "
                "match its digest: the payload_blobs table was altered; restore it from a backup"
            )
        changes[text_field] = data.decode()
    return model.model_copy(update=changes) if changes else model


def bounded_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """Free text (an error message, a hook's detail) cut to `limit` characters, saying so.

    Such text is for people and is never evidence of an effect, so it is cut rather than
    offloaded: a tool raising an exception with a megabyte of message must not stop its
    outcome from being recorded.
    """
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"{text[:limit]}... ({cut} more characters not recorded)"
