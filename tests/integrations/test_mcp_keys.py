"""Reading a call key from an MCP request's `_meta`: one key, or a refusal that says why."""

from __future__ import annotations

import pytest

from toolledger.integrations._mcp_keys import (
    KEY,
    RUN_ID,
    TOOL_CALL_ID,
    KeyMetaError,
    MetaKey,
    key_from_meta,
)
from toolledger.integrations.mcp import meta_for


def test_both_forms_name_the_same_key() -> None:
    split = key_from_meta({RUN_ID: "conv-1", TOOL_CALL_ID: "call:7"})
    whole = key_from_meta({KEY: "conv-1:call_7"})
    assert split is not None and split.key == "conv-1:call:7"
    assert whole is not None and (whole.run_id, whole.tool_call_id) == ("conv-1", "call_7")
    both = key_from_meta({KEY: "r1:c1", RUN_ID: "r1", TOOL_CALL_ID: "c1"})
    assert both == MetaKey("r1", "c1")


def test_a_request_without_ledger_entries_has_no_key() -> None:
    assert key_from_meta(None) is None
    assert key_from_meta({"progressToken": 3, "io.modelcontextprotocol/clientInfo": {}}) is None


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ({RUN_ID: "r1"}, f"without {TOOL_CALL_ID}"),
        ({TOOL_CALL_ID: "c1"}, f"without {RUN_ID}"),
        ({RUN_ID: "r1", TOOL_CALL_ID: 7}, "must be a non-empty string"),
        ({RUN_ID: "", TOOL_CALL_ID: "c1"}, "must be a non-empty string"),
        ({KEY: "r1"}, "not a key"),
        ({KEY: ":c1"}, "not a key"),
        ({KEY: "r1:c1", RUN_ID: "r2"}, "disagrees"),
        ({KEY: "a:b:c"}, "more than one ':'"),
        ({RUN_ID: "user:42", TOOL_CALL_ID: "c1"}, "contains ':'"),
    ],
)
def test_an_unusable_key_is_refused_saying_why(meta: dict[str, object], why: str) -> None:
    """A key that is missing half, malformed, contradictory or ambiguous must be refused (the
    server answers invalid params) rather than guessed, and the message says nothing ran."""
    with pytest.raises(KeyMetaError, match=why) as refused:
        key_from_meta(meta)
    assert "nothing was run" in str(refused.value).lower()


def test_the_client_helper_refuses_what_the_server_would() -> None:
    assert meta_for(run_id="r1", tool_call_id="c1") == {RUN_ID: "r1", TOOL_CALL_ID: "c1"}
    assert meta_for(key="r1:c1") == {KEY: "r1:c1"}
    with pytest.raises(KeyMetaError, match="contains ':'"):
        meta_for(run_id="user:42", tool_call_id="c1")
    with pytest.raises(KeyMetaError, match="not both"):
        meta_for(key="r1:c1", run_id="r1")
    with pytest.raises(KeyMetaError, match="was not sent"):
        meta_for(run_id="r1", tool_call_id="")
