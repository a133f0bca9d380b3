"""Every schema version reads every earlier one, so a log written years ago still folds today.

The general test walks whatever `.avsc` files are on disk and checks fastavro's resolution against
the Avro specification's rules, written out here (`_resolved`): a field the writer lacks takes the
reader's default, a symbol the reader lacks takes the enum's default. Released today: v1 of every
type, CallReserved.v2 (the `warning` field), CallReserved.v3 (`arguments_blob`, `traceparent`,
`tracestate`), v2 of CallCompleted, CallResolved and RunCheckpointed (`result_blob`,
`value_blob`, `state_blob`), and v2 of RunPaused and RunResumed (`expected_version` may be
null: a run its framework drives has no checkpoints). `schemas_fixture/` holds copies of the
released CallReserved versions and a test-only, unreleased CallReserved.v4 (a new field with a
default, a new effect symbol), to prove the machinery catches what it claims.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolledger.events.codec import DecodeError, decode, default_codec, frame, unframe
from toolledger.events.models import CallReserved
from toolledger.schemas import SchemaRegistry

FIXTURE_DIR = Path(__file__).parent / "schemas_fixture"
PACKAGED_DIR = Path(next(iter(SchemaRegistry.packaged())).source).parent

REGISTRIES = {
    "packaged": SchemaRegistry.packaged(),
    "fixture": SchemaRegistry.from_dirs(FIXTURE_DIR),
}

_PRIMITIVES: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "bytes": st.binary(),
    "string": st.text(),
}


def _datums(node: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Any plain Avro value of a schema (logical types are only their underlying type here)."""
    node = named.get(node, node) if isinstance(node, str) else node
    if isinstance(node, str):
        return _PRIMITIVES[node]
    if isinstance(node, list):
        return st.one_of([_datums(branch, named) for branch in node])
    kind = node["type"]
    if kind == "record":
        named[node["name"]] = node
        fields = {f["name"]: _datums(f["type"], named) for f in node["fields"]}
        return st.fixed_dictionaries(fields)
    if kind == "enum":
        named[node["name"]] = node
        return st.sampled_from(node["symbols"])
    if kind == "array":
        return st.lists(_datums(node["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(), _datums(node["values"], named), max_size=3)
    if kind == "fixed":
        named[node["name"]] = node
        return st.binary(min_size=node["size"], max_size=node["size"])
    return _datums(kind, named)


_STRATEGIES: dict[bytes, st.SearchStrategy[Any]] = {}


def _strategy(schema: Any) -> st.SearchStrategy[Any]:
    """The datums of `schema`, built once: rebuilding every strategy for every example made
    input generation slow enough on a busy machine to fail Hypothesis's health check."""
    if schema.fingerprint not in _STRATEGIES:
        _STRATEGIES[schema.fingerprint] = _datums(schema.definition, {})
    return _STRATEGIES[schema.fingerprint]


_PROMOTIONS: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("int", "long"): int,
    ("int", "float"): float,
    ("int", "double"): float,
    ("long", "float"): float,
    ("long", "double"): float,
    ("float", "double"): float,
    ("string", "bytes"): str.encode,
    ("bytes", "string"): bytes.decode,
}


def _resolved(writer: Any, reader: Any, value: Any, names: dict[str, Any]) -> Any:
    """What the Avro specification says a reader sees of a value written with `writer`."""
    if isinstance(writer, str):
        writer = names.get(writer, writer)
    if isinstance(reader, str):
        reader = names.get(reader, reader)
    if isinstance(reader, list):
        if value is None:
            assert "null" in reader
            return None
        (branch,) = [b for b in reader if b != "null"]
        inner = next(b for b in writer if b != "null") if isinstance(writer, list) else writer
        return _resolved(inner, branch, value, names)
    if isinstance(writer, dict) and isinstance(reader, dict) and writer["type"] == reader["type"]:
        kind = reader["type"]
        if kind == "record":
            names[writer["name"]] = writer
            return _resolved_record(writer, reader, value, names)
        if kind == "enum":
            names[writer["name"]] = writer
            if value in reader["symbols"]:
                return value
            assert "default" in reader, f"enum {reader['name']} cannot read symbol {value!r}"
            return reader["default"]
        if kind == "array":
            return [_resolved(writer["items"], reader["items"], v, names) for v in value]
        if kind == "map":
            return {
                k: _resolved(writer["values"], reader["values"], v, names) for k, v in value.items()
            }
    w_type = writer["type"] if isinstance(writer, dict) else writer
    r_type = reader["type"] if isinstance(reader, dict) else reader
    if isinstance(w_type, str) and isinstance(r_type, str):
        return value if w_type == r_type else _PROMOTIONS[(w_type, r_type)](value)
    return _resolved(w_type, r_type, value, names)


def _resolved_record(
    writer: dict[str, Any], reader: dict[str, Any], value: dict[str, Any], names: dict[str, Any]
) -> dict[str, Any]:
    written = {f["name"]: f for f in writer["fields"]}
    out = {}
    for field in reader["fields"]:
        source = next(
            (written[n] for n in [field["name"], *field.get("aliases", [])] if n in written), None
        )
        if source is not None:
            out[field["name"]] = _resolved(
                source["type"], field["type"], value[source["name"]], names
            )
        else:
            assert "default" in field, f"{reader['name']}.{field['name']} is new without a default"
            out[field["name"]] = field["default"]
    return out


# One case per record type: an example draws a datum for each version of one type only, so
# drawing stays cheap as versions accumulate (drawing every type at once tripped hypothesis's
# too-slow health check on a busy machine once the fourth CallReserved version was added).
@pytest.mark.parametrize(
    ("which", "name"), [(w, n) for w in sorted(REGISTRIES) for n in sorted(REGISTRIES[w].names)]
)
@given(data=st.data())
def test_every_schema_version_reads_every_earlier_one(
    which: str, name: str, data: st.DataObject
) -> None:
    """A new version that cannot read an old record would strand that record in the log forever."""
    registry = REGISTRIES[which]
    versions = registry.versions(name)
    for index, writer in enumerate(versions):
        datum = data.draw(_strategy(writer), label=writer.label)
        framed = frame(writer, datum)
        for reader in versions[index:]:
            resolved = unframe(registry, framed, reader=reader)
            assert (resolved.writer, resolved.reader) == (writer, reader)
            expected = _resolved(writer.definition, reader.definition, datum, {})
            assert resolved.value == expected, f"{reader.label} reading {writer.label}"


def test_the_fixture_gives_the_evolution_test_something_to_prove() -> None:
    """Without a future version on disk the general test would compare only released ones."""
    versions = REGISTRIES["fixture"].versions("CallReserved")
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert len({v.fingerprint for v in versions}) == 4


def test_the_fixtures_released_versions_are_the_released_ones() -> None:
    """The fixture must evolve the schemas the log really holds, not look-alikes."""
    for released in SchemaRegistry.packaged().versions("CallReserved"):
        path = FIXTURE_DIR / f"CallReserved.v{released.version}.avsc"
        assert json.loads(path.read_text(encoding="utf-8")) == released.definition


def _event() -> CallReserved:
    return CallReserved(
        key="r1:c1",
        run_id="r1",
        tool_call_id="c1",
        tenant_id="acme",
        tool="billing.issue_credit",
        effect="destructive",
        args_digest="ab" * 32,
        deadline=datetime(2030, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC),
    )


def test_a_v1_record_reads_with_a_newer_reader_and_gets_the_new_fields_defaults() -> None:
    released_v1 = SchemaRegistry.packaged().versions("CallReserved")[0]
    _, datum = default_codec().to_datum(_event())
    v1_datum = {k: v for k, v in datum.items() if k not in ("warning", "arguments_blob")}
    resolved = unframe(REGISTRIES["fixture"], frame(released_v1, v1_datum))
    assert (resolved.writer.version, resolved.reader.version) == (1, 4)
    assert resolved.value == v1_datum | {
        "warning": None,
        "arguments_blob": None,
        "traceparent": None,
        "tracestate": None,
        "attempt_limit": 1,
    }


@pytest.mark.parametrize(
    ("written", "read"), [("sandboxed", "write"), ("destructive", "destructive")]
)
def test_an_effect_symbol_unknown_to_the_v1_reader_reads_as_its_default(
    written: str, read: str
) -> None:
    """An old reader given a newer writer's schema must survive a symbol it has never seen."""
    v1, *_, v4 = REGISTRIES["fixture"].versions("CallReserved")
    original = _event()
    _, datum = default_codec().to_datum(original)
    framed = frame(v4, datum | {"effect": written, "attempt_limit": 3})
    resolved = unframe(REGISTRIES["fixture"], framed, reader=v1)
    assert resolved.value["effect"] == read
    assert "attempt_limit" not in resolved.value
    event = default_codec().from_datum(resolved.value, resolved.reader)
    assert event == original.model_copy(update={"effect": read})


def test_a_reader_without_the_writers_schema_halts_instead_of_guessing() -> None:
    """Defaults help only a reader that has the writer's schema: deploy readers before writers."""
    *_, v4 = REGISTRIES["fixture"].versions("CallReserved")
    _, datum = default_codec().to_datum(_event())
    with pytest.raises(DecodeError) as caught:
        decode(frame(v4, datum | {"attempt_limit": 3}))
    assert caught.value.reason == "unknown_fingerprint"
    assert caught.value.fingerprint == v4.fingerprint.hex()


def _enums(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, list):
        return [e for branch in node for e in _enums(branch)]
    if not isinstance(node, dict):
        return []
    found = [node] if node.get("type") == "enum" else []
    for field in node.get("fields", []):
        found += _enums(field["type"])
    return found + _enums(node["type"]) + _enums(node.get("items"))


@pytest.mark.parametrize("schema", list(SchemaRegistry.packaged()), ids=lambda s: s.label)
def test_every_released_enum_has_a_default_symbol(schema: Any) -> None:
    """Without a default, a reader meeting a newer symbol fails resolution on every such record."""
    for enum in _enums(schema.definition):
        assert enum.get("default") in enum["symbols"], f"{schema.label}: enum {enum['name']}"


def test_a_version_that_changes_only_docs_is_refused(tmp_path: Path) -> None:
    """Docs and defaults are not in the fingerprint, so such a v2 would be v1 on the wire."""
    shutil.copy(PACKAGED_DIR / "RunResumed.v1.avsc", tmp_path)
    definition = json.loads((tmp_path / "RunResumed.v1.avsc").read_text(encoding="utf-8"))
    definition["doc"] = "reworded"
    (tmp_path / "RunResumed.v2.avsc").write_text(json.dumps(definition), encoding="utf-8")
    with pytest.raises(ValueError, match="same fingerprint"):
        SchemaRegistry.from_dirs(tmp_path)


def test_a_schema_file_named_after_another_record_is_refused(tmp_path: Path) -> None:
    shutil.copy(PACKAGED_DIR / "RunResumed.v1.avsc", tmp_path / "RunStarted.v2.avsc")
    with pytest.raises(ValueError, match="file name says"):
        SchemaRegistry.from_dirs(tmp_path)


def test_a_reservations_trace_context_survives_the_codec_and_old_ones_read_without_it() -> None:
    """A traceparent lost on the way through Kafka would cut the projector out of the trace."""
    traced = _event().model_copy(
        update={
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "vendor=opaque",
        }
    )
    assert decode(default_codec().encode(traced)) == traced
    released = SchemaRegistry.packaged().versions("CallReserved")
    _, datum = default_codec().to_datum(traced)
    v2_datum = {k: v for k, v in datum.items() if k not in ("traceparent", "tracestate")}
    old = decode(frame(released[1], v2_datum))
    assert isinstance(old, CallReserved)
    assert (old.traceparent, old.tracestate) == (None, None)
