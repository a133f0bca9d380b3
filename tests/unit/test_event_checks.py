"""The decoder's checks accept only what pydantic accepts, and build the very same event.

`toolledger.events.checks` builds decoded events without pydantic when every check of their
model passes, and hands anything else to pydantic. Its one way to go wrong is to accept a datum
that pydantic refuses (an event the ledger should have dead-lettered would be folded), or to
build it differently (another value, another field order, so another history text and chain
hash). These tests decode random valid events both ways, then break one value at a time with
values pydantic refuses or treats specially, and hold the checks to pydantic's answer.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from pydantic import ValidationError

from tests.unit.test_codec import (
    _codec_decodes_for_real,  # noqa: F401 (autouse: decode for real)
    events,
)
from toolledger.events.checks import EventChecks
from toolledger.events.codec import _apply, default_codec, unframe
from toolledger.events.models import EVENT_TYPES, Event, RunFinished

#: Values a datum cannot hold after Avro decoding unless something is wrong, and values that
#: sit on the edge of a rule (empty, ':', NUL, bounds, other types, other forms of a UUID).
ODD: list[Any] = [
    "",
    ":",
    "a:b",
    "x\x00y",
    "\ud800",
    "é",
    -1,
    0,
    2**63 - 1,
    2**63,
    True,
    False,
    1.5,
    None,
    [],
    ["a", 1],
    {},
    {"host": "h", "pid": -1},
    {"host": "h", "pid": 1, "extra": 1},
    {"key_id": "k", "mac": "m"},
    "not-a-uuid",
    "6FD9E6BD-6E7A-4B8C-951E-4F67B7F1EC82",
    "6fd9e6bd6e7a4b8c951e4f67b7f1ec82",
    "{6fd9e6bd-6e7a-4b8c-951e-4f67b7f1ec82}",
    "6fd9e6bd-6e7a-4b8c-951e-4f67b7f1ec8g",
    "6fd9e6bd-6e7a-4b8c-951e-4f67b7f1ec_2",
    "6fd9e6bd-6e7a-4b8c-951e-4f67b7f1ec82 ",
    -(2**63),
    2**62 * 10,
    datetime(2026, 1, 1),
    datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2))),
    datetime(2026, 1, 1, tzinfo=UTC),
    "write",
    "reconcile",
    "bogus",
]


def _values(event: Event) -> dict[str, Any]:
    """The datum fastavro reads from `event`'s bytes: what the decoder hands to the checks."""
    codec = default_codec()
    datum = unframe(codec.registry, codec.encode(event))
    return datum.value


def _both(model: type[Event], datum: dict[str, Any]) -> tuple[Event | None, Event | None]:
    """(the checks' event or None, pydantic's event or None) for one datum."""
    codec = default_codec()
    schema = codec.registry.latest(model.__name__)
    _, plan, checks = codec._reader_plan(schema)
    assert checks is not None
    fast = checks.event(datum)
    try:
        slow: Event | None = model.model_validate(_apply(plan, datum))
    except (ValidationError, ValueError, TypeError, OverflowError, KeyError):
        slow = None
    return fast, slow


def _same(fast: Event, slow: Event) -> None:
    assert fast == slow
    assert list(fast.__dict__) == list(slow.__dict__)
    assert fast.history_json() == slow.history_json()
    assert fast.model_dump_json() == slow.model_dump_json()


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
def test_every_event_model_is_checked_without_pydantic(model: type[Event]) -> None:
    """A model the checks cannot mirror is decoded by pydantic only: correct, but slow."""
    schema = default_codec().registry.latest(model.__name__)
    assert EventChecks(model, schema.definition).supported


@settings(max_examples=300)
@given(event=events())
def test_a_valid_event_is_built_by_the_checks_as_pydantic_builds_it(event: Event) -> None:
    fast, slow = _both(type(event), _values(event))
    assert fast is not None, "a valid event was left to pydantic"
    assert slow is not None
    _same(fast, slow)


def _broken(values: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`values` with one value replaced, every way: each field and each field of a nested
    mapping (the producer, a signature) by each of `ODD`, and the key by a near miss."""
    out: list[tuple[str, dict[str, Any]]] = [("key", {**values, "key": f"{values['key']}x"})]
    for name, value in values.items():
        for odd in ODD:
            out.append((f"{name}={odd!r}", {**values, name: odd}))
            if isinstance(value, dict):
                for inner in value:
                    broken = {**values, name: {**value, inner: odd}}
                    out.append((f"{name}.{inner}={odd!r}", broken))
    return out


@settings(max_examples=60)
@given(event=events())
def test_a_broken_value_is_never_accepted_where_pydantic_refuses_it(event: Event) -> None:
    """Whatever the checks accept, pydantic accepts too, and as the same event."""
    for what, values in _broken(_values(event)):
        fast, slow = _both(type(event), values)
        if fast is not None:
            assert slow is not None, f"the checks accepted {what}; pydantic did not"
            _same(fast, slow)


def test_text_that_cannot_be_stored_is_cleaned_as_pydantic_cleans_it() -> None:
    """NUL in a decoded string becomes U+FFFD, the run_id's included, before its rules apply."""
    finished = RunFinished(
        key="r1", run_id="r1", tenant_id="acme", expected_version=1, outcome="completed"
    )
    datum = _values(finished) | {"detail": "bad \x00 byte", "run_id": "r\x00un", "key": "r\x00un"}
    fast, slow = _both(RunFinished, datum)
    assert fast is not None and slow is not None
    _same(fast, slow)
    assert fast.run_id == "r\ufffdun"
