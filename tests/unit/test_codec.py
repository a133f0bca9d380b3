"""The log's byte format: every event survives a round trip, and bad bytes fail one known way.

Events are generated from the models' own field annotations, so a field added to a model is
covered here the day it is added (and an annotation the generator cannot handle fails loudly).
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import pytest
from fastavro.schema import to_parsing_canonical_form
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tests import builders as b
from toolledger.events.codec import (
    HEADER_SIZE,
    MARKER,
    Codec,
    DecodeError,
    DecodeReason,
    decode,
    default_codec,
    encode,
    frame,
)
from toolledger.events.models import (
    EVENT_TYPES,
    CallEvent,
    CallReserved,
    Event,
    Producer,
    RunCheckpointed,
    call_key,
)
from toolledger.schemas import SchemaRegistry

FIXTURE_DIR = Path(__file__).parent / "schemas_fixture"

INT64 = st.integers(-(2**63), 2**63 - 1)


#: Codecs of these tests' own (building one compiles every schema's reader and writer).
_FRESH = Codec()
_REMEMBERING = Codec()
_REMEMBERING.remember_encoded(limit=2)


@pytest.fixture(autouse=True, scope="module")
def _codec_decodes_for_real() -> Iterator[None]:
    """These tests are about decoding, so the process-wide codec must decode here, not answer
    from memory: an embedded stack an earlier test made asked it to remember its encodings."""
    codec = default_codec()
    remember, remembered = codec._remember, codec._remembered
    codec._remember, codec._remembered = 0, {}
    yield
    codec._remember, codec._remembered = remember, remembered


TIMESTAMPS = st.datetimes(
    min_value=datetime(2, 1, 1),
    max_value=datetime(9998, 12, 31, 23, 59, 59, 999_999),
    timezones=st.sampled_from(
        [UTC, timezone(timedelta(hours=-8)), timezone(timedelta(hours=5, minutes=45))]
    ),
)


def _strategy(info: FieldInfo, where: str) -> st.SearchStrategy[Any]:
    min_size = max(
        [m.min_length for m in info.metadata if isinstance(m, annotated_types.MinLen)] or [0]
    )
    return _bounded(_for(info.annotation, min_size, where), info.metadata)


def _bounded(strategy: st.SearchStrategy[Any], metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Keep integers inside the field's `ge`/`le` bounds (e.g. Avro longs that are never < 0)."""
    low = [int(m.ge) for m in metadata if isinstance(m, annotated_types.Ge)]  # type: ignore[call-overload]
    high = [int(m.le) for m in metadata if isinstance(m, annotated_types.Le)]  # type: ignore[call-overload]
    if not low and not high:
        return strategy
    lo, hi = max(low, default=-(2**63)), min(high, default=2**63 - 1)
    return strategy.map(
        lambda v: (
            v if not isinstance(v, int) or isinstance(v, bool) else lo + (v - lo) % (hi - lo + 1)
        )
    )


def _for(annotation: Any, min_size: int, where: str) -> st.SearchStrategy[Any]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        metadata = [m for info in args[1:] for m in getattr(info, "metadata", [info])]
        return _bounded(_for(args[0], min_size, where), metadata)
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | _for(inner, min_size, where)
    if origin is Literal:
        return st.sampled_from(args)
    if origin is tuple and args[1:] == (Ellipsis,):
        return st.lists(_for(args[0], 0, where)).map(tuple)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = {n: _strategy(f, f"{where}.{n}") for n, f in annotation.model_fields.items()}
        return st.builds(annotation, **fields)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: st.text(min_size=min_size),
        int: INT64,
        bool: st.booleans(),
        uuid.UUID: st.uuids(),
        datetime: TIMESTAMPS,
    }
    if annotation in simple:
        return simple[annotation]
    raise TypeError(f"{where}: teach test_codec to generate {annotation!r}")


@st.composite
def events(draw: st.DrawFn, model: type[Event] | None = None) -> Event:
    """Any valid event of `model` (or of any type): the envelope consistent, the rest arbitrary."""
    model = model or draw(st.sampled_from(EVENT_TYPES))
    run_id = draw(st.text(min_size=1).filter(lambda s: ":" not in s))
    kwargs: dict[str, Any] = {
        "event_id": draw(st.uuids()),
        "run_id": run_id,
        "key": run_id,
        "tenant_id": draw(st.text(min_size=1)),
        "occurred_at": draw(TIMESTAMPS),
        "producer": draw(_for(Producer, 0, "producer")),
        "schema_version": draw(st.integers(0, 2**63 - 1)),
    }
    if issubclass(model, CallEvent):
        kwargs["tool_call_id"] = draw(st.text(min_size=1))
        kwargs["key"] = call_key(run_id, kwargs["tool_call_id"])
    for name, info in model.model_fields.items():
        if name not in Event.model_fields:
            kwargs[name] = draw(_strategy(info, f"{model.__name__}.{name}"))
    return model(**kwargs)


def _crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO written out from the Avro specification, to check fastavro's against."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def _reserved(**changes: Any) -> CallReserved:
    fields: dict[str, Any] = {
        "key": "r1:c1",
        "run_id": "r1",
        "tool_call_id": "c1",
        "tenant_id": "acme",
        "tool": "billing.issue_credit",
        "args_digest": "ab" * 32,
        "deadline": datetime(2030, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC),
    }
    return CallReserved(**(fields | changes))


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
@given(data=st.data())
def test_every_event_type_survives_a_round_trip(model: type[Event], data: st.DataObject) -> None:
    """A field the codec drops, rounds (microseconds, time zones) or mistypes breaks equality.

    Also what `Codec.remember_encoded` rests on: decoding an event's bytes gives the event back
    field for field, in the same order, so its history text (hence digests) is the same."""
    event = data.draw(events(model))
    decoded = _FRESH.decode(encode(event))  # a codec that remembers nothing: decoded for real
    assert type(decoded) is model
    assert decoded == event
    assert list(decoded.__dict__) == list(event.__dict__)
    assert decoded.history_json() == event.history_json()


@given(event=events())
def test_a_remembering_codec_decodes_what_it_encoded_as_it_would_without(event: Event) -> None:
    """Bytes it encoded decode to their event, once; bytes it did not are decoded."""
    codec = _REMEMBERING
    codec._remembered.clear()
    data = codec.encode(event)
    assert codec.decode(data) is event
    again = codec.decode(data)
    assert again == event and again is not event
    for _ in range(3):
        codec.encode(event.model_copy(update={"event_id": uuid.uuid4()}))
    assert len(codec._remembered) == 2


@given(event=events())
def test_the_frame_names_the_newest_schema_of_the_type(event: Event) -> None:
    """A wrong marker, byte order or fingerprint makes the log unreadable to other Avro readers."""
    encoded = encode(event)
    schema = SchemaRegistry.packaged().latest(type(event).__name__)
    canonical = to_parsing_canonical_form(schema.definition).encode()
    assert encoded[:2] == b"\xc3\x01" == MARKER
    assert encoded[2:HEADER_SIZE] == _crc64_avro(canonical).to_bytes(8, "little")
    assert encoded[2:HEADER_SIZE] == schema.fingerprint


def test_the_fingerprint_matches_the_avro_specification_test_vector() -> None:
    """Avro's schema-tests.txt: the 64-bit fingerprint of "null" (Java's signed long)."""
    assert _crc64_avro(b'"null"') == 7195948357588979594


def test_microseconds_and_time_zones_survive() -> None:
    """An encoder that went through float seconds would lose the last microsecond digits."""
    deadline = datetime(2030, 1, 2, 3, 4, 5, 999_999, tzinfo=timezone(timedelta(hours=-5)))
    decoded = decode(encode(_reserved(deadline=deadline)))
    assert isinstance(decoded, CallReserved)
    assert decoded.deadline == deadline
    assert decoded.deadline.tzinfo == UTC
    assert decoded.deadline.microsecond == 999_999


@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    _decodes_or_fails_cleanly(data)


@given(
    fingerprint=st.sampled_from([s.fingerprint for s in SchemaRegistry.packaged()]),
    body=st.binary(max_size=300),
)
def test_random_bodies_behind_a_known_fingerprint_decode_or_raise_decode_error(
    fingerprint: bytes, body: bytes
) -> None:
    _decodes_or_fails_cleanly(MARKER + fingerprint + body)


@given(
    event=events(),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
    cut=st.none() | st.integers(min_value=0),
)
def test_damaged_encodings_decode_or_raise_decode_error(
    event: Event, edits: list[tuple[int, int]], cut: int | None
) -> None:
    """Flipped bytes and cut records must reach the dead-letter path, never crash the projector."""
    damaged = bytearray(encode(event))
    for position, value in edits:
        damaged[position % len(damaged)] = value
    if cut is not None:
        damaged = damaged[: cut % (len(damaged) + 1)]
    _decodes_or_fails_cleanly(bytes(damaged))


def _decodes_or_fails_cleanly(data: bytes) -> None:
    outcome: Event | DecodeError
    try:
        outcome = decode(data)
    except DecodeError as err:
        outcome = err
    if isinstance(outcome, DecodeError):
        assert outcome.reason in get_args(DecodeReason)
        assert str(outcome).startswith(f"{outcome.reason}: ")
    else:
        assert isinstance(outcome, EVENT_TYPES)
        assert decode(encode(outcome)) == outcome


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc3",
        b"\xc3\x01",
        b"\xc3\x01" + b"\x00" * 7,
        b'{"type":"call_reserved","key":"r1:c1"}',
        b"\xc3\x02" + b"\x00" * 20,
    ],
    ids=["empty", "half-marker", "marker-only", "short-fingerprint", "json", "wrong-marker"],
)
def test_bytes_without_the_single_object_frame_are_not_single_object(data: bytes) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(data)
    assert caught.value.reason == "not_single_object"
    assert caught.value.fingerprint is None


def test_an_unknown_fingerprint_tells_the_operator_to_deploy_readers_first() -> None:
    """This reason halts a partition, so its message must say how to unblock it."""
    body = encode(_reserved())[HEADER_SIZE:]
    unknown = bytes.fromhex("0123456789abcdef")
    with pytest.raises(DecodeError) as caught:
        decode(MARKER + unknown + body)
    assert caught.value.reason == "unknown_fingerprint"
    assert caught.value.fingerprint == "0123456789abcdef"
    assert "0123456789abcdef" in str(caught.value)
    assert "deploy readers before writers" in str(caught.value).lower()


def test_every_cut_of_a_body_is_truncated() -> None:
    """A record cut anywhere after its header must read as truncated, whatever field it cut."""
    encoded = encode(_reserved(run_version=7, compensates="r0:c0"))
    label = f"CallReserved.v{SchemaRegistry.packaged().latest('CallReserved').version}"
    for end in range(HEADER_SIZE, len(encoded)):
        with pytest.raises(DecodeError) as caught:
            decode(encoded[:end])
        assert caught.value.reason == "truncated", (end, str(caught.value))
        assert caught.value.schema == label


def test_trailing_bytes_are_malformed() -> None:
    with pytest.raises(DecodeError) as caught:
        decode(encode(_reserved()) + b"\x00")
    assert caught.value.reason == "malformed"


def test_a_body_that_is_not_utf8_is_malformed() -> None:
    encoded = encode(_reserved(tenant_id="acme"))
    damaged = encoded.replace(b"acme", b"\xff\xfe\xfd\xfc")
    with pytest.raises(DecodeError) as caught:
        decode(damaged)
    assert caught.value.reason == "malformed"
    assert "UnicodeDecodeError" in str(caught.value)


def test_a_well_formed_body_that_breaks_a_model_rule_is_malformed() -> None:
    """Avro-valid bytes can still be an invalid event (a key that is not run_id:tool_call_id)."""
    codec = default_codec()
    schema, datum = codec.to_datum(_reserved())
    with pytest.raises(DecodeError) as caught:
        decode(frame(schema, datum | {"key": "someone-else:c1"}))
    assert caught.value.reason == "malformed"
    assert caught.value.schema == schema.label
    assert "someone-else:c1" in str(caught.value)


def test_a_timestamp_outside_the_calendar_is_malformed_not_an_overflow() -> None:
    schema, datum = default_codec().to_datum(_reserved())
    with pytest.raises(DecodeError) as caught:
        decode(frame(schema, datum | {"deadline": 2**62}))
    assert caught.value.reason == "malformed"


def test_the_datum_layer_holds_plain_avro_values() -> None:
    """The framing layer must not need logical types: uuids are strings, times are micros."""
    event = _reserved()
    _, datum = default_codec().to_datum(event)
    assert datum["event_id"] == str(event.event_id)
    assert datum["deadline"] == 1_893_553_445_678_901
    assert datum["producer"] == {"host": event.producer.host, "pid": event.producer.pid}
    checkpoint = RunCheckpointed(
        key="r1", run_id="r1", tenant_id="acme", expected_version=1, tool_call_ids=("a", "b")
    )
    assert default_codec().to_datum(checkpoint)[1]["tool_call_ids"] == ("a", "b")
    assert "type" not in datum


def test_an_out_of_range_integer_fails_to_encode_with_the_event_named() -> None:
    """Models bound their integers to Avro longs; one built without validation still fails
    with the event named instead of a bare fastavro error."""
    event = _reserved(producer=Producer.model_construct(host="h", pid=2**63))
    with pytest.raises(ValueError, match=r"CallReserved .* \(key r1:c1\) with CallReserved\.v"):
        encode(event)


# --- the models and the newest schemas agree --------------------------------------------------


def _shape_of_annotation(annotation: Any) -> Any:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _shape_of_annotation(args[0])
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return ("union", ("null", _shape_of_annotation(inner)))
    if origin is Literal:
        return ("enum", frozenset(args))
    if origin is tuple:
        return ("array", _shape_of_annotation(args[0]))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return ("record", tuple((n, _field_shape(annotation, n)) for n in annotation.model_fields))
    return {
        str: "string",
        int: "long",
        bool: "boolean",
        uuid.UUID: ("string", "uuid"),
        datetime: ("long", "timestamp-micros"),
    }[annotation]


def _field_shape(model: type[BaseModel], name: str) -> Any:
    # Envelope fields have the envelope's (nullable tool_call_id) shape in every record.
    owner = Event if issubclass(model, Event) and name in Event.model_fields else model
    return _shape_of_annotation(owner.model_fields[name].annotation)


def _shape_of_schema(node: Any) -> Any:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return ("union", tuple(_shape_of_schema(branch) for branch in node))
    if "logicalType" in node:
        return (node["type"], node["logicalType"])
    kind = node["type"]
    if kind == "enum":
        assert node.get("default") in node["symbols"], f"enum {node['name']} needs a default"
        return ("enum", frozenset(node["symbols"]))
    if kind == "array":
        return ("array", _shape_of_schema(node["items"]))
    if kind == "record":
        return ("record", tuple((f["name"], _shape_of_schema(f["type"])) for f in node["fields"]))
    return _shape_of_schema(kind)


@pytest.mark.parametrize("model", EVENT_TYPES, ids=lambda m: m.__name__)
def test_each_model_and_its_newest_schema_agree(model: type[Event]) -> None:
    """A field added to a model without a new .avsc would be silently dropped from the log."""
    schema = SchemaRegistry.packaged().latest(model.__name__)
    in_schema = {f["name"]: _shape_of_schema(f["type"]) for f in schema.definition["fields"]}
    in_model = {n: _field_shape(model, n) for n in model.model_fields if n != "type"}
    assert sorted(in_schema) == sorted(in_model), f"fields differ: {schema.source}"
    for name, shape in in_model.items():
        assert in_schema[name] == shape, f"{model.__name__}.{name} differs from {schema.source}"
    for field in schema.definition["fields"]:
        if isinstance(field["type"], list):
            assert "default" in field and field["default"] is None, field["name"]


def test_every_schema_type_is_an_event_type() -> None:
    assert set(SchemaRegistry.packaged().names) == {m.__name__ for m in EVENT_TYPES}


def test_a_codec_refuses_a_newest_schema_whose_fields_differ_from_the_model() -> None:
    """A process deployed with a schema its models do not match must fail at start, not later."""
    with pytest.raises(ValueError, match=r"only in the schema \['attempt_limit'\]"):
        Codec(SchemaRegistry.from_dirs(FIXTURE_DIR))


def test_unstorable_text_is_replaced_at_any_depth_and_clean_data_is_passed_through() -> None:
    """NUL and lone surrogates become U+FFFD wherever they are; data without them comes back as
    the very same objects (the clean path, every decode's, allocates nothing)."""
    from toolledger.events.models import _clean

    clean = {"a": ["x", ("y", {"z": "ünï"})], "n": 1}
    assert _clean(clean) is clean
    inner = {"z": "b\x00d \udc80"}
    dirty = {"a": ["x", ("y", inner)], "n": 1}
    assert _clean(dirty) == {"a": ["x", ("y", {"z": "b\ufffdd \ufffd"})], "n": 1}
    assert inner["z"] == "b\x00d \udc80"  # the input is left alone
    broken = b.reserved("r1", "c1").model_dump()
    broken["producer"] = {"host": "h\x00st", "pid": 1}
    assert type(b.reserved("r1", "c1")).model_validate(broken).producer.host == "h\ufffdst"
