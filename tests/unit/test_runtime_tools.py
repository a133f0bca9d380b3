"""Tool declarations: what the decorator derives from a function, and what it refuses."""

from __future__ import annotations

import warnings

import pytest
from pydantic import BaseModel, ValidationError

from toolledger import SideEffect, ToolContext, Toolset, destructive, external, read, write
from toolledger.testing import fake_tool_context


class Receipt(BaseModel):
    receipt_id: str
    amount_cents: int


tools = Toolset("shop")


@tools.tool(external(), timeout=5)
async def refund(order_id: str, amount_cents: int, context: ToolContext) -> Receipt:
    """Refund an order."""
    async with context.sending():
        return Receipt(receipt_id=context.idempotency_key, amount_cents=amount_cents)


@tools.tool(read())
async def search(query: str, limit: int = 10, *, context: ToolContext) -> list[Receipt]:
    return [Receipt(receipt_id=f"{query}-{i}", amount_cents=i) for i in range(limit)]


@tools.tool(write())
async def rename(copy: str, schema: str, context: ToolContext) -> None:
    """Parameters named like BaseModel attributes must still work."""


def test_a_tool_is_named_after_its_toolset_and_function() -> None:
    assert refund.name == "shop.refund" and tools.get("shop.refund") is refund
    assert [t.name for t in tools] == ["shop.refund", "shop.search", "shop.rename"]
    assert refund.__doc__ == "Refund an order."


def test_equal_arguments_after_validation_are_one_call() -> None:
    """A model that writes "2500" for an int must not make a second, different call."""
    a = refund.prepare({"order_id": "o1", "amount_cents": 2500})
    b = refund.prepare({"amount_cents": "2500", "order_id": "o1"})
    assert a.digest == b.digest and a.arguments_json == '{"amount_cents":2500,"order_id":"o1"}'
    assert a.values == {"order_id": "o1", "amount_cents": 2500}


def test_defaults_are_part_of_the_fingerprint() -> None:
    assert (
        search.prepare({"query": "q"}).digest == search.prepare({"query": "q", "limit": 10}).digest
    )


def test_arguments_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValidationError):
        refund.prepare({"order_id": "o1"})
    with pytest.raises(ValidationError):
        refund.prepare({"order_id": "o1", "amount_cents": 1, "note": "extra"})
    with pytest.raises(ValidationError):
        refund.prepare({"order_id": "o1", "amount_cents": "lots"})


def test_parameters_named_like_model_attributes_do_not_shadow_anything() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = rename.prepare({"copy": "a", "schema": "b"})
    assert prepared.values == {"copy": "a", "schema": "b"}


def test_results_round_trip_through_their_declared_type() -> None:
    stored = refund.dump_result(Receipt(receipt_id="r", amount_cents=5))
    assert refund.load_result(stored) == Receipt(receipt_id="r", amount_cents=5)
    listed = search.dump_result([Receipt(receipt_id="a", amount_cents=1)])
    assert search.load_result(listed) == [Receipt(receipt_id="a", amount_cents=1)]
    assert rename.load_result(rename.dump_result(None)) is None


def test_a_result_that_does_not_fit_is_still_stored() -> None:
    """The effect happened: losing its result because the type hint was wrong is worse."""
    assert refund.dump_result({"receipt_id": "r", "amount_cents": 1}) == (
        '{"receipt_id":"r","amount_cents":1}'
    )
    assert refund.dump_result({"unexpected": True}) == '{"unexpected":true}'


def test_sending_is_detected_from_the_source() -> None:
    assert refund.marks_sending and not search.marks_sending and not rename.marks_sending


async def test_a_tool_can_be_called_directly_in_unit_tests() -> None:
    receipt = await refund("o1", 100, fake_tool_context(run_id="r9", tool_call_id="c1"))
    assert receipt == Receipt(receipt_id="r9:c1", amount_cents=100)


def test_declarations_that_cannot_work_are_refused() -> None:
    box = Toolset("box")

    def sync_tool(context: ToolContext) -> None: ...

    async def no_context(x: int) -> int:
        return x

    async def var_args(*args: int, context: ToolContext) -> None: ...

    async def fine(context: ToolContext) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        box.tool(write())(sync_tool)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="context: ToolContext"):
        box.tool(write())(no_context)
    with pytest.raises(TypeError, match="plain named parameter"):
        box.tool(write())(var_args)
    with pytest.raises(ValueError, match="positive timeout"):
        box.tool(write(), timeout=0)(fine)
    box.tool(write())(fine)
    with pytest.raises(ValueError, match="already has a tool"):
        box.tool(write())(fine)
    with pytest.raises(ValueError, match="name"):
        Toolset("a:b")


def test_side_effects_set_the_retry_rule() -> None:
    """Writes get one attempt whatever they declare; reads up to three."""
    assert read().max_attempts == 3 and write().max_attempts == 1
    assert SideEffect("write", attempts=3).max_attempts == 1
    assert external().approval is False and destructive().approval is True
    with pytest.raises(ValueError, match="1 to 3"):
        read(attempts=4)
    with pytest.raises(ValueError, match="at least one"):
        SideEffect("read", attempts=0)


def test_read_backoff_is_jittered_under_an_exponential_cap() -> None:
    effect = read(backoff=0.1)
    for attempt, cap in ((2, 0.1), (3, 0.2)):
        delays = [effect.backoff_before(attempt) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays) and len(set(delays)) > 1
    assert effect.worst_case_backoff() == pytest.approx(0.3)


def test_the_budget_covers_every_attempt() -> None:
    """The reservation's deadline must not pass while a read is still being retried."""
    assert refund.budget == 5
    assert search.budget == pytest.approx(3 * 30 + 0.3)
