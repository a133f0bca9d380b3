"""Frozen models built from values already known to be valid, without validating them again.

Pydantic stays at the edges (tool arguments and results, API bodies, settings, events as a
caller builds them): there every value is validated once. Inside, the decider builds each new
call and run record and each verdict from fields of an event that was validated when it was
built or decoded, and the fold builds a history entry per event from that event and its
verdict. Validating those again found nothing and cost 3-10 us per model, several times per
event, on the path every call and every replayed event takes (BENCHMARKS.md, issue 16).

`build` and `replace` make such a model the way `model_construct` does, minus its per-field
Python loop: the instance's `__dict__` is the values, in field order (pydantic serialises in
`__dict__` order, so a record built here dumps to the same JSON as a validated one). Callers
pass every field; mypy checks the values at the call sites that name them, and the contract
suite, the lifecycle state machine and the recorded log check that the ledgers and digests are
the ones validation would have produced (`tests/unit/test_trusted.py` compares the two ways).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_set = object.__setattr__


def build(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of `cls` holding `values`: every field of `cls`, in declaration order."""
    model = cls.__new__(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(values))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def replace(model: M, changes: dict[str, Any]) -> M:
    """`model` with `changes` (field name -> new value), as `model_copy(update=changes)`."""
    values = model.__dict__.copy()
    values.update(changes)
    return build(type(model), values)


def ordered(cls: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` in the field order of `cls` (for a caller that gathered them in another)."""
    return {name: values[name] for name in cls.model_fields}
