"""Every Avro schema of the event log ever released, loaded once and indexed by fingerprint.

A record in `toolledger.events` names its writer schema only by the CRC-64-AVRO fingerprint of that
schema's Parsing Canonical Form, so a reader can decode it only if it ships that exact schema. That
is why no released `<Type>.v<N>.avsc` file is ever edited or deleted: the log keeps its records
forever, and each one needs its writer schema forever. The newest version of each record type is
the reader schema; Avro resolution turns any older writer's data into its shape.

Parsing is the expensive part, so it happens here, once per process, and the codec reuses the
parsed forms for every record. Logical types (uuid, timestamp-micros) are removed from the parsed
forms: the codec's model layer converts those values itself, and they are not part of the
canonical form, so the fingerprint is the same either way.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

#: The namespace every event record is declared in.
NAMESPACE = "toolledger.events"

_FILE_NAME = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")


@dataclass(frozen=True, eq=False)
class AvroSchema:
    """One released version of one record type, as its file defines it and as fastavro runs it."""

    name: str
    version: int
    #: The 8 bytes that follow the `C3 01` marker in a record written with this schema.
    fingerprint: bytes
    definition: dict[str, Any] = field(repr=False)
    parsed: Any = field(repr=False)
    source: str = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.name}.v{self.version}"

    @classmethod
    def load(cls, name: str, version: int, text: str, source: str) -> AvroSchema:
        definition = json.loads(text)
        if not isinstance(definition, dict) or definition.get("type") != "record":
            raise ValueError(f"{source}: an event schema must be one Avro record")
        declared = f"{definition.get('namespace', '')}.{definition.get('name', '')}"
        if declared != f"{NAMESPACE}.{name}":
            raise ValueError(
                f"{source}: declares {declared}, the file name says {NAMESPACE}.{name}"
            )
        canonical = to_parsing_canonical_form(definition)
        return cls(
            name=name,
            version=version,
            fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
            definition=definition,
            parsed=parse_schema(_without_logical_types(definition), named_schemas={}),
            source=source,
        )


def _without_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_without_logical_types(item) for item in node]
    return node


class SchemaRegistry:
    """The schemas a process can read: writer schemas by fingerprint, reader schemas by type.

    A registry refuses two files with the same fingerprint: Parsing Canonical Form ignores docs,
    defaults and logical types, so a "new version" that changes only those would be
    indistinguishable on the wire from the old one.
    """

    def __init__(self, schemas: Iterable[AvroSchema]) -> None:
        self._by_fingerprint: dict[bytes, AvroSchema] = {}
        versions: dict[str, dict[int, AvroSchema]] = {}
        for schema in schemas:
            same = self._by_fingerprint.get(schema.fingerprint)
            if same is not None:
                raise ValueError(
                    f"{schema.source} has the same fingerprint as {same.source}: a new version "
                    "must change a field, a type or an enum symbol, not only docs or defaults"
                )
            twin = versions.setdefault(schema.name, {}).get(schema.version)
            if twin is not None:
                raise ValueError(f"{schema.label} is defined twice: {twin.source}, {schema.source}")
            self._by_fingerprint[schema.fingerprint] = schema
            versions[schema.name][schema.version] = schema
        self._versions = {
            name: tuple(by_version[v] for v in sorted(by_version))
            for name, by_version in sorted(versions.items())
        }

    @classmethod
    def from_dirs(cls, *directories: Traversable) -> SchemaRegistry:
        """Load every `<Type>.v<N>.avsc` in the directories; any other `.avsc` name is an error."""
        schemas = []
        for directory in directories:
            for entry in directory.iterdir():
                if not entry.name.endswith(".avsc"):
                    continue
                match = _FILE_NAME.match(entry.name)
                if match is None:
                    raise ValueError(f"{entry}: schema files are named <Type>.v<N>.avsc")
                text = entry.read_text(encoding="utf-8")
                schemas.append(
                    AvroSchema.load(match["name"], int(match["version"]), text, str(entry))
                )
        return cls(schemas)

    @staticmethod
    @functools.cache
    def packaged() -> SchemaRegistry:
        """The schemas shipped in this package: every version toolledger ever released."""
        return SchemaRegistry.from_dirs(files(__name__))

    def by_fingerprint(self, fingerprint: bytes) -> AvroSchema | None:
        return self._by_fingerprint.get(fingerprint)

    def latest(self, name: str) -> AvroSchema:
        """The reader schema of a record type: its newest version."""
        try:
            return self._versions[name][-1]
        except KeyError:
            raise KeyError(f"no schema for record type {name!r} in this registry") from None

    def versions(self, name: str) -> tuple[AvroSchema, ...]:
        """Every version of a record type, oldest first."""
        return self._versions.get(name, ())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._versions)

    def __iter__(self) -> Iterator[AvroSchema]:
        return (schema for versions in self._versions.values() for schema in versions)

    def __len__(self) -> int:
        return len(self._by_fingerprint)
