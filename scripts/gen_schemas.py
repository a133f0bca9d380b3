"""Draft the Avro schema of each event model whose shape no committed schema describes yet.

The committed `toolledger/schemas/*.avsc` files are the source of truth, not this script: a
released schema is part of the log's durable format and is never regenerated or edited. This tool
only saves typing when a model gains a field. It derives a schema from the pydantic model, and for
every event type whose newest committed schema differs from it (by Parsing Canonical Form) it writes
`<Type>.v<N+1>.avsc` next to the others. It never overwrites a file. Review the draft before
committing it: the new field needs a default an old writer's data can take, and an enum's
`default` symbol decides what an old reader makes of a symbol it has never seen.

    python -m scripts.gen_schemas            # write drafts for changed models
    python -m scripts.gen_schemas --check    # exit 1 if any model has no matching schema
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from fastavro.schema import to_parsing_canonical_form
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from toolledger.events.models import EVENT_TYPES, Event, Producer, Signature

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "toolledger" / "schemas"
NAMESPACE = "toolledger.events"

#: Avro enum name, fallback symbol and doc per Literal field (`field@Model` where it differs by
#: model). The fallback is what an old reader makes of a symbol added after it was built, so each
#: is the reading that does the least harm; the doc says why, for whoever reads the schema.
ENUMS: dict[str, tuple[str, str, str]] = {
    "effect": (
        "Effect",
        "write",
        "An unknown effect class reads as write: one attempt, never retried on its own.",
    ),
    "source": (
        "OutcomeSource",
        "runtime",
        "An unknown source reads as runtime: the outcome must name the live reservation.",
    ),
    "outcome@CallResolved": (
        "ResolvedOutcome",
        "completed",
        "An unknown resolution reads as completed: the call never runs again. Reading it as"
        " failed would let the call run a second time.",
    ),
    "outcome@RunFinished": (
        "RunOutcome",
        "failed",
        "An unknown run outcome reads as failed: the run did not reach its goal.",
    ),
    "reason@RunPaused": (
        "PauseReason",
        "host",
        "An unknown pause reason reads as host: paused by the program driving the run.",
    ),
}

_FILE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")


def _record(model: type[BaseModel], name: str, owner: str) -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "fields": [_field(model, field, owner) for field in model.model_fields if field != "type"],
    }


def _field(model: type[BaseModel], name: str, owner: str) -> dict[str, Any]:
    # Envelope fields keep the envelope's shape in every record, so any consumer reads them alike.
    source = Event if name in Event.model_fields else model
    info = source.model_fields[name]
    avro_type = _avro_type(info.annotation, name, owner)
    field: dict[str, Any] = {"name": name, "type": avro_type}
    if isinstance(avro_type, list):
        field["default"] = None
    elif info.default is not PydanticUndefined and info.default_factory is None:
        field["default"] = list(info.default) if isinstance(info.default, tuple) else info.default
    return field


def _avro_type(annotation: Any, name: str, owner: str) -> Any:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:  # bounds (e.g. Long) do not change the Avro type
        return _avro_type(args[0], name, owner)
    if origin in (Union, types.UnionType):
        (inner,) = [arg for arg in args if arg is not type(None)]
        return ["null", _avro_type(inner, name, owner)]
    if origin is Literal:
        enum_name, default, doc = ENUMS.get(f"{name}@{owner}") or ENUMS[name]
        return {
            "type": "enum",
            "name": enum_name,
            "doc": doc,
            "symbols": list(args),
            "default": default,
        }
    if origin is tuple and args[1:] == (Ellipsis,):
        return {"type": "array", "items": _avro_type(args[0], name, owner)}
    simple: dict[Any, Any] = {
        str: "string",
        int: "long",
        bool: "boolean",
        uuid.UUID: {"type": "string", "logicalType": "uuid"},
        datetime: {"type": "long", "logicalType": "timestamp-micros"},
    }
    if annotation in simple:
        return simple[annotation]
    if annotation is Producer or annotation is Signature:
        return _record(annotation, annotation.__name__, owner)
    raise TypeError(f"{owner}.{name}: no Avro mapping for {annotation!r}; extend gen_schemas.py")


def schema_for(model: type[Event]) -> dict[str, Any]:
    """The Avro record a model's current fields describe, with its docstring as the doc."""
    head: dict[str, Any] = {"type": "record", "name": model.__name__, "namespace": NAMESPACE}
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    if doc:
        head["doc"] = doc
    return head | {"fields": _record(model, model.__name__, model.__name__)["fields"]}


def latest_committed(directory: Path) -> dict[str, tuple[int, Path]]:
    latest: dict[str, tuple[int, Path]] = {}
    for path in directory.glob("*.avsc"):
        match = _FILE.match(path.name)
        if match is None:
            continue
        version = int(match["version"])
        if version > latest.get(match["name"], (0, path))[0]:
            latest[match["name"]] = (version, path)
    return latest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR)
    options = parser.parse_args(argv)
    latest = latest_committed(options.dir)
    drift = 0
    for model in EVENT_TYPES:
        drafted = schema_for(model)
        version, path = latest.get(model.__name__, (0, None))
        if path is not None:
            committed = json.loads(path.read_text(encoding="utf-8"))
            if to_parsing_canonical_form(committed) == to_parsing_canonical_form(drafted):
                continue
        drift += 1
        target = options.dir / f"{model.__name__}.v{version + 1}.avsc"
        if options.check:
            print(
                f"{model.__name__}: model differs from {path or 'no schema'}; draft {target.name}"
            )
            continue
        if target.exists():
            print(f"{target} exists; not overwriting", file=sys.stderr)
            return 1
        target.write_text(json.dumps(drafted, indent=2, ensure_ascii=False) + "\n", "utf-8")
        print(f"wrote {target} (review its defaults before committing)")
    return 1 if options.check and drift else 0


if __name__ == "__main__":
    sys.exit(main())
