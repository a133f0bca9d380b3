"""The generated Avro writer writes every event byte for byte as fastavro does.

`toolledger.events.avro_write` replaces fastavro's writer on the encode path; records it wrote
are read by fastavro everywhere (projectors, replay, other versions of toolledger), so the one
acceptable difference from fastavro's bytes is none. A varint, a union branch, an enum index, a
length in characters instead of bytes, or an array block written differently fails here.
"""

from __future__ import annotations

import io

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings

from tests.unit.test_codec import (
    _codec_decodes_for_real,  # noqa: F401 (autouse: decode for real)
    _reserved,
    events,
)
from toolledger.events.avro_write import write_long
from toolledger.events.codec import decode, default_codec, frame
from toolledger.events.models import EVENT_TYPES, Event


def _fastavro(event: Event) -> bytes:
    schema, datum = default_codec().to_datum(event)
    return frame(schema, datum)


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
def test_every_event_type_has_a_generated_writer(model: type[Event]) -> None:
    """A schema the writer cannot write is encoded by fastavro only: correct, but slow."""
    assert model in default_codec()._bodies


@settings(max_examples=500)
@given(event=events())
def test_an_event_is_written_as_fastavro_writes_it(event: Event) -> None:
    written = default_codec().encode(event)
    assert written == _fastavro(event)
    assert decode(written) == event


def test_a_value_the_writer_cannot_write_is_left_to_fastavro_and_its_error() -> None:
    """A model built without validation may hold anything; fastavro says what is wrong."""
    bad = _reserved().model_copy(update={"effect": "teleport"})
    with pytest.raises(ValueError, match="cannot encode CallReserved"):
        default_codec().encode(bad)


@pytest.mark.parametrize("n", [0, 1, -1, 63, -64, 64, -65, 2**31, 2**63 - 1, -(2**63)])
def test_longs_are_written_as_fastavro_writes_them(n: int) -> None:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema("long"), n)
    assert write_long(n) == out.getvalue()


@pytest.mark.parametrize("n", [2**63, -(2**63) - 1])
def test_a_long_out_of_range_is_refused(n: int) -> None:
    with pytest.raises(OverflowError):
        write_long(n)
