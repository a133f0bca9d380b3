"""Agent configuration: how a run treats unknown calls, errors and repeated intents.

Loaded from YAML and validated by pydantic; unknown keys are errors (a typo such as
`on_indeterminte: pause` must not silently mean the default), and every error names the field
(`agents[0].tool_policy.on_indeterminate: Input should be 'fail' or 'pause'`).

    agents:
      - name: billing-assistant
        tool_policy:
          on_indeterminate: pause      # fail (default) | pause
          on_error: fail_run           # fail_run (default) | return_to_model
          duplicate_intent: hold       # hold (default) | allow
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolledger.errors import ToolLedgerError


class AgentConfigError(ToolLedgerError, ValueError):
    """The agent configuration is invalid; the message names the file and the field."""

    code = "agent_config"


class ToolPolicy(BaseModel):
    """What a run does when a tool call is unknown, fails, or repeats an unsettled intent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: `fail`: the run fails (or, with `on_error: return_to_model`, the model hears that the
    #: outcome is unknown, status `indeterminate`, never "failed"). `pause`: the run waits in
    #: `awaiting_reconciliation` until the call is settled.
    on_indeterminate: Literal["fail", "pause"] = "fail"
    #: `fail_run`: a failed call fails the run. `return_to_model`: the model hears the failure.
    on_error: Literal["fail_run", "return_to_model"] = "fail_run"
    #: `hold`: a new call repeating an unsettled call's tool and arguments waits for it.
    #: `allow`: it runs, and its reservation carries a warning into the history.
    duplicate_intent: Literal["hold", "allow"] = "hold"


class AgentConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    tool_policy: ToolPolicy = ToolPolicy()


class AgentsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    agents: list[AgentConfig] = Field(min_length=1)


def parse_agents(text: str, source: str = "<agents>") -> dict[str, AgentConfig]:
    """Agents by name from YAML text; `AgentConfigError` naming the field on any problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AgentConfigError(f"{source}: not valid YAML: {exc}") from None
    try:
        parsed = AgentsFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = "".join(
                f"[{part}]" if isinstance(part, int) else f".{part}" for part in err["loc"]
            ).lstrip(".")
            problems.append(f"{where or 'agents'}: {err['msg']}")
        raise AgentConfigError(f"{source}: " + "; ".join(problems)) from None
    names = [a.name for a in parsed.agents]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AgentConfigError(f"{source}: agent names must be unique ({', '.join(duplicates)})")
    return {a.name: a for a in parsed.agents}


def load_agents(path: str | Path) -> dict[str, AgentConfig]:
    path = Path(path)
    return parse_agents(path.read_text(), str(path))
