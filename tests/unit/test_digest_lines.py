"""The digest's lines, made by orjson, are the bytes the standard library's canonical JSON made.

`ledger_digest` (replay, audit, the recorded-log fixture) hashes one line per call, run and
history entry: the canonical JSON (sorted keys, no whitespace, UTF-8) of its JSON-mode dump.
`digest_json` makes them with orjson, which is 7x faster, and falls back to `canonical_json`
for what orjson refuses. That is only sound where the two agree byte for byte: every code point
as text and as a key, key order, integers to 64 bits, nesting, and no float anywhere (they write
floats differently), which the records' field types guarantee and this file checks.
"""

from __future__ import annotations

import json
import types
import typing
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from toolledger.events.fold import HistoryEntry, call_line, digest_json, history_line, run_line
from toolledger.events.models import canonical_json
from toolledger.events.records import CallRecord, RunRecord

SURROGATES = range(0xD800, 0xE000)
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


def test_every_code_point_as_text_and_as_key_is_written_alike() -> None:
    for start in range(0, 0x110000, 0x800):
        chars = [chr(c) for c in range(start, start + 0x800) if c not in SURROGATES]
        if not chars:
            continue
        value = {c: c + "x" + c for c in chars} | {"all": "".join(chars)}
        assert digest_json(value) == canonical_json(value).encode(), hex(start)


@given(json_values)
def test_any_float_free_json_value_is_written_alike(value: object) -> None:
    assert digest_json(value) == canonical_json(value).encode()


def test_what_orjson_refuses_takes_the_standard_librarys_way() -> None:
    huge = {"n": 2**64, "m": -(2**63) - 1, "nested": [2**70]}
    assert digest_json(huge) == canonical_json(huge).encode()
    with pytest.raises(UnicodeEncodeError):  # as before: a lone surrogate is never a line
        digest_json({"k": "\ud800"})


def test_floats_are_written_differently_which_is_why_no_line_may_hold_one() -> None:
    for value in (1e-07, float("nan")):
        assert digest_json({"x": value}) != canonical_json({"x": value}).encode()


def _types_in(annotation: object) -> set[object]:
    found = {annotation}
    for arg in typing.get_args(annotation):
        found |= _types_in(arg)
    origin = typing.get_origin(annotation)
    if origin is not None and not isinstance(origin, types.UnionType):
        found.add(origin)
    return found


@pytest.mark.parametrize("model", [CallRecord, RunRecord, HistoryEntry])
def test_the_records_behind_the_lines_have_no_float_field(model: type[BaseModel]) -> None:
    hints = typing.get_type_hints(model)
    floats = [name for name in model.model_fields if float in _types_in(hints[name])]
    assert floats == [], f"{model.__name__} fields {floats} would make digest lines differ"


def test_each_line_is_the_canonical_json_of_its_records_dump() -> None:
    now = datetime(2026, 12, 1, 19, 0, 0, 123456, tzinfo=UTC)
    call = CallRecord(
        key="r:c", run_id="r", tool_call_id="c", tenant_id="t\u00e9", tool="refund",
        effect="write", status="completed", version=2, reservation_id=uuid.uuid4(),
        args_digest="ab" * 32, arguments_json='{"amount":25,"note":"\u2028"}',
        requires_approval=False, deadline=now + timedelta(seconds=30), result_json='"ok"',
        created_at=now, updated_at=now.replace(microsecond=0),
    )  # fmt: skip
    run = RunRecord(run_id="r", tenant_id="t", version=3, checkpoint_calls=("c",), updated_at=now)
    entry = HistoryEntry(
        key="r:c", event_id=uuid.uuid4(), event_type="call_completed", partition=1, offset=7,
        accepted=True, reason="accepted", detail="", occurred_at=now, actor="runtime:h/1",
        version=2, event_json=json.dumps({"\u00fc": "\x01"}), chain_hash="cd" * 32,
    )  # fmt: skip
    assert call_line(call) == canonical_json(call.ledger_form()).encode()
    assert run_line(run) == canonical_json(run.ledger_form()).encode()
    assert history_line(entry) == canonical_json(entry.model_dump(mode="json")).encode()
