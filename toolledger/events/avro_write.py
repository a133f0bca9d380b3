"""Avro binary bodies of events, written by generated Python instead of fastavro's writer.

Encoding an event was the runtime's largest single cost per append on the embedded ledger
(BENCHMARKS.md, issue 16): the datum layer turned the model into a dict of Avro values, then
fastavro's writer walked the schema for every record, resolving each `[null, T]` union by
testing the value against its branches. Event schemas are flat records of a few kinds, so a
writer generated once per schema (as `toolledger.events.checks` generates readers) writes the
body straight from the model's fields: zig-zag varints for longs and lengths, UTF-8 for strings,
the branch index of each union from whether the value is None, enum symbols by index, the
producer and signature records inline, arrays as one block.

The bytes must be exactly fastavro's: `tests/unit/test_avro_write.py` compares both on random
events of every type. A schema with a shape not written here gets no writer (the codec keeps
fastavro for it), and a value the generated code cannot write (a wrong type in a model built
without validation) raises, after which the codec writes that event with fastavro, which either
writes it or raises its own error: this writer never decides what is writable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from toolledger.schemas import AvroSchema

Writer = Callable[[Any], bytes]
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
#: Zig-zag varints of -64..63, one byte each: lengths, versions, booleans as numbers.
_SMALL = {n: bytes([(n << 1) ^ (n >> 63)]) for n in range(-64, 64)}


class Unsupported(Exception):
    """A schema shape this writer does not produce: the codec keeps fastavro for it."""


def write_long(n: int) -> bytes:
    """An Avro `long`: zig-zag, then 7 bits a byte, least significant first."""
    small = _SMALL.get(n)
    if small is not None and n.__class__ is int:
        return small
    if n.__class__ is not int or not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n!r} is not an Avro long")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


class _Source:
    """The lines of one generated writer and the names they use."""

    def __init__(self, micros: Callable[[datetime], int]) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_long": write_long, "_micros": micros}
        self._count = 0

    def name(self, prefix: str, value: Any = None) -> str:
        self._count += 1
        name = f"_{prefix}{self._count}"
        if value is not None:
            self.names[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def value(self, depth: int, expr: str, avro: Any, named: dict[str, Any]) -> None:
        """Lines appending the encoding of `expr` (an Avro type `avro`) to `out`."""
        if isinstance(avro, str) and avro in named:
            avro = named[avro]
        if isinstance(avro, list):
            branches = [b for b in avro if b != "null"]
            if len(avro) != 2 or len(branches) != 1:
                raise Unsupported(f"union {avro!r}")
            none, some = (b"\x00", b"\x02") if avro[0] == "null" else (b"\x02", b"\x00")
            var = self.name("u")
            self.emit(depth, f"{var} = {expr}")
            self.emit(depth, f"if {var} is None: out.append({none!r})")
            self.emit(depth, "else:")
            self.emit(depth + 1, f"out.append({some!r})")
            self.value(depth + 1, var, branches[0], named)
            return
        kind = avro if isinstance(avro, str) else avro["type"]
        logical = None if isinstance(avro, str) else avro.get("logicalType")
        if kind == "string" and logical == "uuid":
            text = self.name("s")
            self.emit(depth, f"{text} = str({expr}).encode()")
            self.emit(depth, f"out.append(_long(len({text}))); out.append({text})")
        elif kind == "string" and logical is None:
            text = self.name("s")
            self.emit(depth, f"{text} = {expr}.encode()")
            self.emit(depth, f"out.append(_long(len({text}))); out.append({text})")
        elif kind == "long" and logical == "timestamp-micros":
            self.emit(depth, f"out.append(_long(_micros({expr})))")
        elif kind == "long" and logical is None:
            self.emit(depth, f"out.append(_long({expr}))")
        elif kind == "boolean" and logical is None:
            flag = self.name("b")
            self.emit(depth, f"{flag} = {expr}")
            self.emit(depth, f"if {flag}.__class__ is not bool: raise TypeError({flag})")
            self.emit(depth, f"out.append(b'\\x01' if {flag} else b'\\x00')")
        elif kind == "enum" and logical is None:
            index = {s: write_long(i) for i, s in enumerate(avro["symbols"])}
            self.emit(depth, f"out.append({self.name('e', index)}[{expr}])")
            _define(named, avro)
        elif kind == "array" and logical is None and avro["items"] == "string":
            items, item = self.name("a"), self.name("i")
            self.emit(depth, f"{items} = {expr}")
            self.emit(depth, f"if {items}:")
            self.emit(depth + 1, f"out.append(_long(len({items})))")
            self.emit(depth + 1, f"for {item} in {items}:")
            self.value(depth + 2, item, "string", named)
            self.emit(depth, "out.append(b'\\x00')")
        elif kind == "record" and logical is None:
            _define(named, avro)
            record = self.name("r")
            self.emit(depth, f"{record} = {expr}.__dict__")
            for field in avro["fields"]:
                self.value(depth, f"{record}[{field['name']!r}]", field["type"], named)
        else:
            raise Unsupported(f"type {avro!r}")


def _define(named: dict[str, Any], avro: Mapping[str, Any]) -> None:
    """A named type, by its name and its full name, for later references to it."""
    named[avro["name"]] = avro
    if "namespace" in avro:
        named[f"{avro['namespace']}.{avro['name']}"] = avro


def writer(schema: AvroSchema, micros: Callable[[datetime], int]) -> Writer | None:
    """The generated writer of bodies of `schema` from an event model, or None if its shape is
    not one written here. `micros` is the datum layer's datetime conversion."""
    source = _Source(micros)
    source.emit(0, "def write(event):")
    source.emit(1, "out = []")
    named: dict[str, Mapping[str, Any]] = {}
    try:
        source.value(1, "event", schema.definition, named)
    except Unsupported:
        return None
    source.emit(1, "return b''.join(out)")
    names = source.names
    label = f"<toolledger.events.avro_write: {schema.label}>"
    exec(compile("\n".join(source.lines), label, "exec"), names)  # noqa: S102
    write: Writer = names["write"]
    return write
