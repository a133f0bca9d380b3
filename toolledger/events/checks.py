"""Decoded events checked the way their pydantic models check them, without pydantic.

Every record a projector or a replay folds is decoded into its event model, and validating the
datum with pydantic was the largest single cost of decoding (BENCHMARKS.md, issue 16): the
model's own validators run in Python for every event (the storable-text scan of every string,
the key check, the UTC check of each timestamp), on values whose types the Avro schema already
fixed. `EventChecks` writes, once per model, one straight-line function that reads a datum as
fastavro returns it and applies the checks the model's fields and validators declare, and
builds the model (`toolledger.events.trusted`) only if every check passes:

- strings must be `str`, cleaned as `_Storable` cleans them (NUL and lone surrogates become
  U+FFFD), then held to `min_length` and the `RunId` rule (non-empty, no ':');
- integers must be `int` within `ge` / `le` (every `Long` is 0 <= n < 2**63), booleans `bool`;
- UUIDs must be 36-character hyphenated hex strings; timestamps (Avro `timestamp-micros`)
  become aware UTC datetimes as the codec's datum layer makes them;
- literals must be one of their values (an Avro enum resolved to the reader's symbols), a nested
  model (the producer, a signature) a record checked the same way, a `tuple[str, ...]` a list
  of strings;
- the envelope's `key` must be `<run_id>:<tool_call_id>`, or the run_id, as `Event` requires.

A datum that fails any check goes to pydantic, which raises its own error (the decoder's
"malformed"), or accepts it if it is more lenient: a check can only ever send a datum the slow
way, never accept one pydantic would refuse. So the checks must never be weaker than the model.
Two guards keep them so: a model whose fields or validators declare anything this module does
not know is not checked here at all (every datum of it goes to pydantic), and
`tests/unit/test_event_checks.py` holds both ways to the same answer on random events with
every field broken in turn.

The function is generated source (as `dataclasses` writes `__init__`) because one Python call
per field cost as much as pydantic itself did; `EventChecks.source` shows what it runs.
"""

from __future__ import annotations

import re
import types
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Le, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.functional_validators import AfterValidator

from toolledger.events import models
from toolledger.events.trusted import build

#: The model validators whose rules this module applies itself (see the module docstring).
_KNOWN_VALIDATORS = frozenset({"_storable_text", "_key_matches"})
_UUID_FORM = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Nested models remembered per model (producers: one per process that appended events).
_MEMO = 4096


class Unsupported(Exception):
    """A field or validator these checks cannot mirror: the model stays with pydantic."""


def _micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


class _Writer:
    """Writes the source of one model's reader: one block of checks per field."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {
            "_clean": models._clean,
            "_uuid": uuid.UUID,
            "_uuid_form": _UUID_FORM.fullmatch,
            "_micros": _micros,
            "_build": build,
        }
        self._count = 0

    def constant(self, value: Any) -> str:
        self._count += 1
        name = f"_c{self._count}"
        self.names[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def field(self, depth: int, var: str, annotation: Any, metadata: list[Any], avro: Any) -> None:
        """Checks that leave the model's value of one field in `var` or return None."""
        origin = get_origin(annotation)
        if origin is Annotated:
            base, *extra = get_args(annotation)
            inner: list[Any] = []
            for item in extra:
                inner.extend(item.metadata if isinstance(item, FieldInfo) else [item])
            self.field(depth, var, base, [*inner, *metadata], avro)
            return
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            branches = [b for b in avro if b != "null"] if isinstance(avro, list) else []
            if len(members) != 1 or len(get_args(annotation)) != 2 or len(branches) != 1:
                raise Unsupported(repr(annotation))
            self.emit(depth, f"if {var} is not None:")
            self.field(depth + 1, var, members[0], metadata, branches[0])
            return
        if origin is Literal and not metadata:
            choices = self.constant(frozenset(get_args(annotation)))
            self.emit(
                depth, f"if {var}.__class__ is not str or {var} not in {choices}: return None"
            )
            return
        if origin is tuple and not metadata and get_args(annotation) == (str, Ellipsis):
            self.emit(depth, f"if {var}.__class__ is not list: return None")
            self.emit(depth, f"for _x in {var}:")
            self.emit(depth + 1, "if _x.__class__ is not str: return None")
            clean = "_x if _x.isascii() and '\\x00' not in _x else _clean(_x)"
            self.emit(depth, f"{var} = tuple({clean} for _x in {var})")
            return
        logical = avro.get("logicalType") if isinstance(avro, dict) else None
        if annotation is str:
            self._string(depth, var, metadata)
        elif annotation is int:
            self._integer(depth, var, metadata)
        elif annotation is datetime and metadata == [AfterValidator(models._as_utc)]:
            if logical != "timestamp-micros":
                raise Unsupported(f"a datetime stored as {avro!r}")
            self.emit(depth, f"if {var}.__class__ is not int: return None")
            self.emit(depth, f"{var} = _micros({var})")
        elif metadata:
            raise Unsupported(repr(metadata))
        elif annotation is bool:
            self.emit(depth, f"if {var}.__class__ is not bool: return None")
        elif annotation is uuid.UUID:
            if logical != "uuid":
                raise Unsupported(f"a UUID stored as {avro!r}")
            self.emit(
                depth, f"if {var}.__class__ is not str or _uuid_form({var}) is None: return None"
            )
            self.emit(depth, f"{var} = _uuid({var})")
        elif annotation is type(None):
            self.emit(depth, f"if {var} is not None: return None")
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if not isinstance(avro, dict) or avro.get("type") != "record":
                raise Unsupported(f"{annotation.__name__} stored as {avro!r}")
            reader = self.constant(_reader(annotation, avro))
            self.emit(depth, f"{var} = {reader}({var})")
            self.emit(depth, f"if {var} is None: return None")
        else:
            raise Unsupported(repr(annotation))

    def _string(self, depth: int, var: str, metadata: list[Any]) -> None:
        least, run_id = 0, False
        for item in metadata:
            if isinstance(item, MinLen):
                least = max(least, item.min_length)
            elif isinstance(item, AfterValidator) and item.func is models._no_colon:
                run_id = True
            else:
                raise Unsupported(repr(item))
        self.emit(depth, f"if {var}.__class__ is not str: return None")
        self.emit(depth, f"if not {var}.isascii() or '\\x00' in {var}: {var} = _clean({var})")
        if least:
            self.emit(depth, f"if len({var}) < {least}: return None")
        if run_id:
            self.emit(depth, f"if not {var} or ':' in {var}: return None")

    def _integer(self, depth: int, var: str, metadata: list[Any]) -> None:
        bounds = []
        for item in metadata:
            if isinstance(item, Ge):
                bounds.append(f"{var} < {int(item.ge)}")  # type: ignore[call-overload]
            elif isinstance(item, Le):
                bounds.append(f"{var} > {int(item.le)}")  # type: ignore[call-overload]
            else:
                raise Unsupported(repr(item))
        self.emit(depth, " or ".join([f"if {var}.__class__ is not int", *bounds]) + ": return None")


def _fields(cls: type[BaseModel]) -> dict[str, FieldInfo]:
    decorators = cls.__pydantic_decorators__
    validators = set(decorators.model_validators)
    others = (decorators.field_validators, decorators.validators, decorators.root_validators)
    if not validators <= _KNOWN_VALIDATORS or any(others):
        raise Unsupported(f"{cls.__name__} has validators {sorted(validators)}")
    if cls.model_config.get("extra") != "forbid":
        raise Unsupported(f"{cls.__name__} accepts extra fields")
    return dict(cls.model_fields)


def _source(
    cls: type[BaseModel], record: Mapping[str, Any], constant: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The source of the reader of `cls` from datums of the Avro `record`, and its globals."""
    fields = _fields(cls)
    avro = {f["name"]: f["type"] for f in record["fields"]}
    constant = constant or {}
    if set(avro) | set(constant) != set(fields) or set(avro) & set(constant):
        raise Unsupported(f"{cls.__name__} and its schema have other fields")
    writer = _Writer()
    writer.emit(0, "def read(d):")
    writer.emit(1, f"if d.__class__ is not dict or len(d) != {len(avro)}: return None")
    writer.emit(1, "try:")
    variables: dict[str, str] = {}
    for i, (name, info) in enumerate(fields.items()):
        if name in constant:
            variables[name] = writer.constant(constant[name])
            continue
        var = variables[name] = f"v{i}"
        writer.emit(2, f"{var} = d[{name!r}]")
        writer.field(2, var, info.annotation, list(info.metadata), avro[name])
    writer.emit(1, "except (KeyError, OverflowError):")
    writer.emit(2, "return None")
    if "_key_matches" in cls.__pydantic_decorators__.model_validators:
        key, run, call = (variables[n] for n in ("key", "run_id", "tool_call_id"))
        writer.emit(
            1, f"if {key} != ({run} if {call} is None else {run} + ':' + {call}): return None"
        )
    body = ", ".join(f"{name!r}: {var}" for name, var in variables.items())
    built = f"_build({writer.constant(cls)}, {{{body}}})"
    if constant:
        writer.emit(1, f"return {built}")
    else:
        # A nested model (the producer) repeats from event to event: equal checked values
        # share one frozen instance instead of building it again.
        memo = writer.constant({})
        writer.emit(1, f"k = ({', '.join(variables.values())},)")
        writer.emit(1, f"m = {memo}.get(k)")
        writer.emit(1, "if m is None:")
        writer.emit(2, f"if len({memo}) >= {_MEMO}: {memo}.clear()")
        writer.emit(2, f"m = {memo}[k] = {built}")
        writer.emit(1, "return m")
    return "\n".join(writer.lines), writer.names


def _reader(
    cls: type[BaseModel], record: Mapping[str, Any], constant: dict[str, Any] | None = None
) -> Callable[[Any], Any]:
    source, names = _source(cls, record, constant)
    exec(compile(source, f"<toolledger.events.checks: {cls.__name__}>", "exec"), names)  # noqa: S102
    read: Callable[[Any], Any] = names["read"]
    return read


class EventChecks:
    """Builds one event model from datums of its newest schema that pass its checks."""

    def __init__(self, model: type[models.Event], schema: Mapping[str, Any]) -> None:
        self.model = model
        constant = {"type": model.model_fields["type"].default}
        try:
            self.source: str | None = _source(model, schema, constant)[0]
            self._read: Callable[[Any], Any] | None = _reader(model, schema, constant)
        except Unsupported:
            self.source, self._read = None, None

    @property
    def supported(self) -> bool:
        """Whether datums of this model are checked here at all."""
        return self._read is not None

    def event(self, datum: Mapping[str, Any]) -> models.Event | None:
        """The event a datum (as fastavro read it) holds if it passes every check, else None:
        ask pydantic."""
        if self._read is None:
            return None
        event: models.Event | None = self._read(datum)
        return event
