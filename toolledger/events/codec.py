"""Events to bytes and back: the format of every record in `toolledger.events`, forever.

Two layers, so each can be tested and replaced on its own:

- the **datum layer** turns a frozen event model into a plain Avro datum and back: datetimes become
  microseconds since the epoch (UTC), UUIDs strings, nested models dicts. It is driven by the
  record's schema, so a new schema version needs no codec change.
- the **framing layer** turns a datum into Avro single-object encoding and back: the marker
  `C3 01`, the 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema, then the binary
  body. A reader finds the writer schema by its fingerprint among every schema ever released
  (`toolledger.schemas`) and resolves it to the newest version of that record type, so old
  records keep decoding after the models grow.

Both have a fast path that every event of the newest schemas takes, and a slow one that
decides whenever the fast one cannot: bodies are written by a writer generated per schema
(`toolledger.events.avro_write`, byte for byte fastavro's), else by the datum layer and
fastavro; datums read by fastavro are checked and built by a reader generated per model
(`toolledger.events.checks`), else validated by pydantic. A process that decodes what it
encodes (the embedded stack) can have the codec remember the events behind its encodings
(`Codec.remember_encoded`).

Decoding fails in exactly one way, `DecodeError`, whose `reason` tells the projector what to do:
an unknown fingerprint halts the partition (a producer is newer than this reader), anything else
sends the record to the dead-letter topic. Any other exception escaping `decode` is a bug.
"""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

from fastavro import schemaless_reader, schemaless_writer
from pydantic import ValidationError

from toolledger.errors import ToolLedgerError
from toolledger.events.avro_write import Writer, writer
from toolledger.events.checks import EventChecks
from toolledger.events.models import EVENT_TYPES, Event
from toolledger.schemas import AvroSchema, SchemaRegistry

MARKER = b"\xc3\x01"
HEADER_SIZE = len(MARKER) + 8

DecodeReason = Literal["not_single_object", "unknown_fingerprint", "truncated", "malformed"]


class DecodeError(ToolLedgerError):
    """Bytes that are not an event this process can read, and why.

    `fingerprint` (hex, as framed) and `schema` (`<Type>.v<N>`) are set when the frame told us.
    """

    code = "undecodable"

    def __init__(
        self,
        reason: DecodeReason,
        detail: str,
        *,
        fingerprint: bytes | None = None,
        schema: AvroSchema | None = None,
    ) -> None:
        self.reason: DecodeReason = reason
        self.fingerprint = fingerprint.hex() if fingerprint is not None else None
        self.schema = schema.label if schema is not None else None
        where = [f"fingerprint {self.fingerprint}"] if self.fingerprint else []
        where += [f"schema {self.schema}"] if self.schema else []
        suffix = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{reason}: {detail}{suffix}")


class Datum(NamedTuple):
    """A framed record's body, resolved from its writer schema to the reader schema."""

    writer: AvroSchema
    reader: AvroSchema
    value: dict[str, Any]


# --- framing layer: datum <-> single-object encoding ---------------------------------------------


def frame(schema: AvroSchema, datum: Mapping[str, Any]) -> bytes:
    """Single-object encoding of a datum written with `schema`."""
    out = io.BytesIO()
    out.write(MARKER + schema.fingerprint)
    schemaless_writer(out, schema.parsed, datum)
    return out.getvalue()


def unframe(registry: SchemaRegistry, data: bytes, reader: AvroSchema | None = None) -> Datum:
    """Read a single-object encoded record, resolved to `reader` (default: its type's newest).

    Raises DecodeError, and nothing else, for bytes that are not such a record.
    """
    if len(data) < HEADER_SIZE or data[:2] != MARKER:
        raise DecodeError(
            "not_single_object",
            f"expected the marker C3 01 and an 8-byte schema fingerprint, got {len(data)} bytes "
            f"starting {data[:HEADER_SIZE].hex(' ') or '(empty)'}",
        )
    fingerprint = bytes(data[2:HEADER_SIZE])
    writer = registry.by_fingerprint(fingerprint)
    if writer is None:
        raise DecodeError(
            "unknown_fingerprint",
            f"no schema in this reader's registry ({len(registry)} schemas) has this fingerprint,"
            " so a producer wrote it with a schema this reader was not shipped. Deploy readers "
            "before writers: ship the new .avsc to every consumer, then restart this one (if no "
            "producer is newer than this reader, the fingerprint bytes are damaged)",
            fingerprint=fingerprint,
        )
    if reader is None:
        reader = registry.latest(writer.name)
    body = io.BytesIO(data)
    body.seek(HEADER_SIZE)
    try:
        value = schemaless_reader(body, writer.parsed, None if reader is writer else reader.parsed)
    except Exception as exc:  # fastavro signals corrupt input with many unrelated types.
        reason, detail = _diagnose(data, writer, reader, exc)
        raise DecodeError(reason, detail, fingerprint=fingerprint, schema=writer) from exc
    if body.tell() != len(data):
        raise DecodeError(
            "malformed",
            f"{len(data) - body.tell()} bytes follow the end of the body",
            fingerprint=fingerprint,
            schema=writer,
        )
    if not isinstance(value, dict):
        raise DecodeError(
            "malformed", "body is not a record", fingerprint=fingerprint, schema=writer
        )
    return Datum(writer, reader, value)


class _Probe(io.BytesIO):
    """A body stream that remembers whether the reader asked for bytes past its end."""

    past_end = False
    bad_length = False

    def read(self, size: int | None = -1, /) -> bytes:
        if size is None or size < 0:
            self.bad_length = True
            return super().read(size)
        chunk = super().read(size)
        if len(chunk) < size and not self.bad_length:
            self.past_end = True
        return chunk


def _diagnose(
    data: bytes, writer: AvroSchema, reader: AvroSchema, exc: Exception
) -> tuple[DecodeReason, str]:
    """Tell a body that ends early from one that is garbage, by reading it again carefully.

    fastavro raises EOFError, IndexError or others when input runs out, depending on the type
    it was reading; only where the read stopped says which it was. This runs on failures only, so
    the fast path keeps its in-memory stream.
    """
    probe = _Probe(data[HEADER_SIZE:])
    with contextlib.suppress(Exception):  # the same failure again; only the probe's notes matter.
        schemaless_reader(probe, writer.parsed, None if reader is writer else reader.parsed)
    body_size = len(data) - HEADER_SIZE
    if probe.past_end:
        return "truncated", f"the body ends at byte {body_size} before the record does"
    return "malformed", f"the body is not a {writer.label} record: {type(exc).__name__}: {exc}"


# --- datum layer: model <-> datum ----------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
Convert = Callable[[Any], Any]
_Plan = tuple[tuple[str, Convert | None], ...]


def _micros(value: datetime) -> int:
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def _compile(node: Any, to_datum: bool, named: dict[str, _Plan]) -> Convert | None:
    """The conversion one Avro type needs in one direction, or None where the value passes as is."""
    if isinstance(node, str):
        plan = named.get(node)
        return None if plan is None else _record_converter(plan, to_datum)
    if isinstance(node, list):
        branches = [branch for branch in node if branch != "null"]
        if len(branches) != 1:
            raise ValueError("the event codec supports only the union [null, T]")
        inner = _compile(branches[0], to_datum, named)
        return None if inner is None else (lambda v: None if v is None else inner(v))
    kind, logical = node["type"], node.get("logicalType")
    if logical == "uuid":
        return str if to_datum else None
    if logical == "timestamp-micros":
        return _micros if to_datum else _from_micros
    if kind == "record":
        plan = _plan(node, to_datum, named)
        named[node["name"]] = named[f"{node.get('namespace', '')}.{node['name']}"] = plan
        return _record_converter(plan, to_datum)
    if kind == "array":
        item = _compile(node["items"], to_datum, named)
        return None if item is None else (lambda v: [item(x) for x in v])
    if kind == "map":
        value = _compile(node["values"], to_datum, named)
        return None if value is None else (lambda v: {k: value(x) for k, x in v.items()})
    if isinstance(kind, list | dict):
        return _compile(kind, to_datum, named)
    return None


def _plan(record: Mapping[str, Any], to_datum: bool, named: dict[str, _Plan]) -> _Plan:
    return tuple((f["name"], _compile(f["type"], to_datum, named)) for f in record["fields"])


def _record_converter(plan: _Plan, to_datum: bool) -> Convert:
    if to_datum:
        return lambda model: _apply(plan, model.__dict__)
    return lambda mapping: _apply(plan, mapping)


def _apply(plan: _Plan, values: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, convert in plan:
        value = values[name]
        out[name] = value if convert is None else convert(value)
    return out


class Codec:
    """Encodes events with the newest schema of their type; decodes any released version.

    Construction checks that the newest schema of every record type has exactly its model's
    fields, so a model and its schema cannot drift apart silently in a deployed process.
    """

    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self.registry = registry if registry is not None else SchemaRegistry.packaged()
        self._models: dict[str, type[Event]] = {m.__name__: m for m in EVENT_TYPES}
        self._writers: dict[type[Event], tuple[AvroSchema, _Plan]] = {}
        self._bodies: dict[type[Event], tuple[bytes, Writer]] = {}
        self._remembered: dict[bytes, Event] = {}
        self._remember = 0
        self._readers: dict[bytes, tuple[type[Event], _Plan, EventChecks | None]] = {}
        for name in self.registry.names:
            schema = self.registry.latest(name)
            model = self._model_of(schema)
            fields = {f["name"] for f in schema.definition["fields"]}
            expected = set(model.model_fields) - {"type"}
            if fields != expected:
                raise ValueError(
                    f"{schema.source} and models.{name} disagree: only in the schema "
                    f"{sorted(fields - expected)}, only in the model {sorted(expected - fields)}"
                )
            self._writers[model] = (schema, _plan(schema.definition, True, {}))
            body = writer(schema, _micros)
            if body is not None:
                self._bodies[model] = (MARKER + schema.fingerprint, body)
            self._reader_plan(schema)

    def _model_of(self, schema: AvroSchema) -> type[Event]:
        model = self._models.get(schema.name)
        if model is None:
            raise ValueError(f"{schema.source}: no event model is named {schema.name}")
        return model

    def _reader_plan(self, schema: AvroSchema) -> tuple[type[Event], _Plan, EventChecks | None]:
        """The model, the datum plan and, for the newest schema of a type (whose fields are the
        model's, checked above), the checks that build the model without pydantic."""
        found = self._readers.get(schema.fingerprint)
        if found is None:
            model = self._model_of(schema)
            latest = schema is self.registry.latest(schema.name)
            found = self._readers[schema.fingerprint] = (
                model,
                _plan(schema.definition, False, {}),
                EventChecks(model, schema.definition) if latest else None,
            )
        return found

    def to_datum(self, event: Event) -> tuple[AvroSchema, dict[str, Any]]:
        """The newest schema of the event's type and the event as a datum of it."""
        try:
            schema, plan = self._writers[type(event)]
        except KeyError:
            raise ValueError(f"no schema for {type(event).__name__} in this registry") from None
        return schema, _apply(plan, event.__dict__)

    def from_datum(self, datum: Mapping[str, Any], schema: AvroSchema) -> Event:
        """The event a datum of `schema` holds; DecodeError("malformed") if it is not valid.

        A datum that passes the model's checks (`toolledger.events.checks`) is built without
        pydantic; any other is validated by pydantic, which says what is wrong with it.
        """
        model, plan, checks = self._reader_plan(schema)
        event = None if checks is None else checks.event(datum)
        if event is not None:
            return event
        try:
            return model.model_validate(_apply(plan, datum))
        except (ValidationError, ValueError, OverflowError, TypeError, KeyError) as exc:
            raise DecodeError(
                "malformed",
                f"the body is not a valid {model.__name__}: {exc}",
                fingerprint=schema.fingerprint,
                schema=schema,
            ) from exc

    def remember_encoded(self, limit: int = 1024) -> None:
        """From now on, remember the event behind each encoding until this process decodes it.

        For a process that decodes what it encodes: the embedded stack's log, store and projector
        share one, and decoding was the largest cost on a call's path there (BENCHMARKS.md, "the
        event path's own CPU"). `decode` of bytes this codec encoded returns the event they were
        encoded from, which is what decoding them gives for every event its model validated (or
        a copy with valid values, as every append in toolledger is): the round trip tests
        (`tests/unit/test_codec.py`) prove the same fields, values and order, hence the same
        history text and digests. Each remembered event is forgotten once decoded, and the
        oldest once `limit` wait; a second decode of the same bytes (a replay) decodes them.
        """
        self._remember = max(self._remember, limit)

    def encode(self, event: Event) -> bytes:
        """Single-object encoding with the newest schema of the event's type (remembered for
        `decode` after `remember_encoded`)."""
        data = self._encode(event)
        if self._remember:
            remembered = self._remembered
            if len(remembered) >= self._remember:
                # Another thread encoding or decoding at once may empty it first: nothing lost.
                with contextlib.suppress(RuntimeError, StopIteration, KeyError):
                    del remembered[next(iter(remembered))]
            remembered[data] = event
        return data

    def _encode(self, event: Event) -> bytes:
        """The body by the generated writer (`toolledger.events.avro_write`), else by fastavro,
        which also writes, or refuses, whatever the generated writer could not."""
        fast = self._bodies.get(type(event))
        if fast is not None:
            try:
                return fast[0] + fast[1](event)
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
                pass
        schema, datum = self.to_datum(event)
        try:
            return frame(schema, datum)
        except (ValueError, OverflowError, TypeError) as exc:
            raise ValueError(
                f"cannot encode {type(event).__name__} {event.event_id} (key {event.key}) with "
                f"{schema.label}: {exc}"
            ) from exc

    def decode(self, data: bytes) -> Event:
        if self._remembered:
            event = self._remembered.pop(data, None)
            if event is not None:
                return event
        datum = unframe(self.registry, data)
        return self.from_datum(datum.value, datum.reader)


@functools.cache
def default_codec() -> Codec:
    """The codec over the packaged schemas, built once per process."""
    return Codec()


def encode(event: Event) -> bytes:
    """Single-object encoding of an event with the newest schema of its type."""
    return default_codec().encode(event)


def decode(data: bytes) -> Event:
    """The event a record holds, whichever released schema wrote it; else DecodeError."""
    return default_codec().decode(data)
