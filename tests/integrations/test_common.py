"""The framework-free part of the adapters: model-facing names, keys, options."""

from __future__ import annotations

import pytest

from toolledger import ToolContext, Toolset, write
from toolledger.integrations import (
    AdapterOptions,
    ToolNames,
    call_key_for,
    decode_run_id,
    encode_run_id,
)
from toolledger.integrations._common import SAFE_NAME
from toolledger.runtime.agents import ToolPolicy


def _tools(toolset: str, *names: str) -> Toolset:
    tools = Toolset(toolset)
    for name in names:

        async def fn(context: ToolContext) -> None:
            """A tool."""

        fn.__name__ = name
        tools.tool(write())(fn)
    return tools


def test_dotted_names_map_to_safe_names_and_back() -> None:
    names = ToolNames(_tools("billing", "issue_credit", "void_credit"))
    assert names.model_name("billing.issue_credit") == "billing__issue_credit"
    tool = names.tool("billing__issue_credit")
    assert tool is not None and tool.name == "billing.issue_credit"
    assert names.tool("billing.issue_credit") is None, "the model never sees the dotted name"


def test_names_that_would_collide_get_distinct_stable_suffixes() -> None:
    """`a.b_c` and `a_.b_c`... must not share a model-facing name, whatever the order."""
    first = ToolNames([*_tools("a.b", "c"), *_tools("a", "b__c")])
    second = ToolNames([*_tools("a", "b__c"), *_tools("a.b", "c")])
    assert first.model_name("a.b.c") != first.model_name("a.b__c")
    for name in ("a.b.c", "a.b__c"):
        assert first.model_name(name) == second.model_name(name)
        assert SAFE_NAME.match(first.model_name(name))
        tool = first.tool(first.model_name(name))
        assert tool is not None and tool.name == name


def test_long_and_odd_names_are_made_safe() -> None:
    names = ToolNames(_tools("crm v2/" + "x" * 70, "find"))
    (model_name, tool) = next(iter(names.items()))
    assert SAFE_NAME.match(model_name) and len(model_name) <= 64
    assert names.tool(model_name) is tool


@pytest.mark.parametrize("thread", ["user:42", "a%3Ab", "%", "::", "plain"])
def test_run_ids_encode_colons_reversibly(thread: str) -> None:
    run_id = encode_run_id(thread)
    assert ":" not in run_id
    assert decode_run_id(run_id) == thread


def test_two_thread_ids_never_share_a_run_id() -> None:
    """`a:b` and `a%3Ab` are different threads; an encoding that merged them would share keys."""
    assert encode_run_id("a:b") != encode_run_id("a%3Ab")


def test_a_key_splits_between_run_id_and_call_id_only() -> None:
    key = call_key_for("user:42", "call:7", source="thread_id")
    assert key.key.partition(":") == ("user%3A42", ":", "call:7")


@pytest.mark.parametrize("missing", [None, ""])
def test_a_missing_run_id_is_refused_naming_where_it_comes_from(missing: str | None) -> None:
    with pytest.raises(ValueError, match=r'config\["configurable"\]\["thread_id"\]'):
        call_key_for(missing, "c1", source='config["configurable"]["thread_id"]')


def test_a_missing_call_id_is_refused() -> None:
    with pytest.raises(ValueError, match="no tool call id"):
        call_key_for("t1", None, source="thread_id")


def test_options_take_an_agents_tool_policy() -> None:
    policy = ToolPolicy(on_indeterminate="fail", duplicate_intent="allow")
    assert AdapterOptions.from_policy(policy) == AdapterOptions("fail", "allow")
    assert AdapterOptions() == AdapterOptions("pause", "hold")
