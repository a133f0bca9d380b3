"""Agent configuration: a typo or a wrong value must stop startup with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolledger.runtime.agents import AgentConfigError, load_agents, parse_agents

GOOD = """
agents:
  - name: billing-assistant
    tool_policy:
      on_indeterminate: pause
      on_error: return_to_model
      duplicate_intent: allow
  - name: search-helper
"""


def test_a_valid_file_gives_each_agent_its_policy_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(GOOD)
    agents = load_agents(path)
    billing = agents["billing-assistant"].tool_policy
    assert (billing.on_indeterminate, billing.on_error, billing.duplicate_intent) == (
        "pause",
        "return_to_model",
        "allow",
    )
    default = agents["search-helper"].tool_policy
    assert (default.on_indeterminate, default.on_error, default.duplicate_intent) == (
        "fail",
        "fail_run",
        "hold",
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "agents:\n  - name: a\n    tool_policy:\n      on_indeterminate: retry\n",
            "agents[0].tool_policy.on_indeterminate",
        ),
        (
            "agents:\n  - name: a\n    tool_policy:\n      on_indeterminte: pause\n",
            "agents[0].tool_policy.on_indeterminte",
        ),
        ("agents:\n  - tool_policy: {}\n", "agents[0].name"),
        ("agents: []\n", "agents"),
        ("agents:\n  - name: a\n  - name: a\n", "unique (a)"),
        ("agents: [\n", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(AgentConfigError) as caught:
        parse_agents(text, "agents.yaml")
    assert named in str(caught.value)
    assert str(caught.value).startswith("agents.yaml: ")
