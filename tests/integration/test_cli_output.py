"""The CLI as a newcomer meets it, against real Kafka and PostgreSQL: each test runs the
`toolledger` command in a subprocess with its output piped (no terminal, no `COLUMNS`)."""

from __future__ import annotations

import os
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import api_support as s
from tests.integration.procs import run_toolledger_async
from tests.isolated import Isolated, child_env, running_stack
from toolledger.settings import Settings


@pytest.fixture
def ledger_settings(isolated: Isolated) -> Settings:
    return s.api_settings(**isolated.connection())


@pytest.fixture
async def calls(ledger_settings: Settings) -> AsyncIterator[s.Calls]:
    async with running_stack(ledger_settings) as stack:
        yield s.Calls(stack)


async def _cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env |= {
        **child_env(settings),
        "TOOLLEDGER_SIGNING_KEYS": s.SIGNING_KEY.setting(),
        "TOOLLEDGER_OPERATOR": "carol",
    }
    return await run_toolledger_async(env, *args)


async def test_history_of_a_bare_ledger_run_shows_its_calls(
    calls: s.Calls, ledger_settings: Settings
) -> None:
    """`history RUN_ID` said "no history" for a run made with `Ledger.call` alone, although its
    help says a run id works: such a run has no events of its own, only its calls'."""
    first = await calls.completed("bare-run", "c1")
    second = await calls.indeterminate("bare-run", "c2")
    await calls.completed("other-run", "c1")
    code, out, err = await _cli(ledger_settings, "history", "bare-run")
    assert code == 0, out + err
    assert first.key in out and second.key in out
    assert "other-run" not in out
    assert out.index("call_completed") < out.index("call_indeterminate")  # log order


async def test_show_of_a_call_resolved_completed_no_longer_prints_its_old_error(
    calls: s.Calls, ledger_settings: Settings
) -> None:
    """A call resolved `completed` still printed "error timeout" from before it was settled."""
    r = await calls.indeterminate("resolved-run")
    code, out, err = await _cli(ledger_settings, "executions", "show", r.key)
    assert code == 0, err
    assert "error timeout" in out  # while indeterminate, the error is why
    code, out, err = await _cli(
        ledger_settings, "executions", "resolve", r.key, "--outcome", "completed",
        "--reason", "found in billing",
    )  # fmt: skip
    assert code == 0, err
    assert "settled by operator carol: found in billing" in out
    code, out, err = await _cli(ledger_settings, "executions", "show", r.key)
    assert code == 0, err
    assert "error timeout" not in out
    assert "call_indeterminate" in out  # the history still tells it


async def test_piped_listings_show_whole_keys_tool_names_and_token_ids(
    calls: s.Calls, ledger_settings: Settings
) -> None:
    """Piped output was cut to 80 columns with ellipses, so `tokens revoke` needed an id that
    `tokens list` never showed whole."""
    run_id = "a-run-id-far-longer-than-any-table-column-of-eighty-characters-would-allow"
    tool = "billing_and_payments.issue_a_credit_to_the_customer_account"
    r = await calls.indeterminate(run_id, "call-0987654321", tool=tool)
    code, out, err = await _cli(ledger_settings, "executions", "list")
    assert code == 0, err
    assert r.key in out and tool in out
    code, _, err = await _cli(
        ledger_settings, "tokens", "create", "--tenant", "acme",
        "--operator", "an-operator-with-a-long-name@example.com", "--role", "viewer",
    )  # fmt: skip
    assert code == 0, err
    token_id = err.split()[1].rstrip(":")
    code, out, err = await _cli(ledger_settings, "tokens", "list")
    assert code == 0, err
    assert token_id in out and "an-operator-with-a-long-name@example.com" in out
    code, out, err = await _cli(ledger_settings, "tokens", "revoke", token_id)
    assert code == 0, err


def _row(out: str, key: str) -> list[str]:
    """The cells of the table row that starts with `key`."""
    line = next(line for line in out.splitlines() if f" {key} " in line)
    return [cell.strip() for cell in line.split("│")[1:-1]]


async def test_the_queue_shows_a_waiting_time_only_for_calls_that_wait(
    calls: s.Calls, ledger_settings: Settings
) -> None:
    """`executions list` showed "waiting 3m" for a call completed three minutes ago: a settled
    call waits for no one, so its waiting cell is "-"."""
    done = await calls.completed("waits-run", "c1")
    unknown = await calls.indeterminate("waits-run", "c2")
    code, out, err = await _cli(ledger_settings, "executions", "list")
    assert code == 0, err
    header = next(line for line in out.splitlines() if "┃ key" in line)
    waiting = [cell.strip() for cell in header.split("┃")[1:-1]].index("waiting")
    assert _row(out, done.key)[waiting] == "-"
    assert _row(out, unknown.key)[waiting].rstrip("smhd").isdigit()


async def test_a_key_not_found_names_the_tenant_and_the_cli_command_not_an_http_route(
    calls: s.Calls, ledger_settings: Settings
) -> None:
    """`executions show` of an unknown key said "in this tenant" with no tenant given, and
    advised `GET /v1/tool-executions` to someone at a shell."""
    code, _, err = await _cli(ledger_settings, "executions", "show", "no-such:call")
    assert code == 1
    assert "no tool execution 'no-such:call' in any tenant" in err
    assert "`toolledger executions list`" in err and "GET /v1" not in err
    code, _, err = await _cli(
        ledger_settings, "executions", "show", "no-such:call", "--tenant", "acme"
    )
    assert code == 1 and "in tenant acme;" in err


async def test_a_replay_of_a_log_that_is_not_there_names_the_command_that_creates_it(
    isolated: Isolated,
) -> None:
    """`replay` against a topic prefix with no topics advised `ensure_topic (or
    create_topic)`, Python names a command-line user cannot run."""
    settings = s.api_settings(**isolated.connection())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env |= {**child_env(settings), "TOOLLEDGER_VERIFY_KEYS": s.SIGNING_KEY.public_setting()}
    code, out, err = await run_toolledger_async(env, "replay", "--verify")
    assert code == 2 and "`toolledger migrate`" in err, out + err  # no ledger yet: no schema
    assert "Unclosed" not in err
    code, out, err = await run_toolledger_async(env, "migrate")
    assert code == 0, out + err
    code, out, err = await run_toolledger_async(env, "replay", "--verify")
    assert code == 4, out + err
    assert "`toolledger projector`" in err and "ensure_topic" not in err


async def test_the_readmes_compensate_line_runs_as_written(
    calls: s.Calls, ledger_settings: Settings
) -> None:
    """The README's `executions compensate r1:c7 --reason ...` exited 1: without `--tools`
    this process has no compensation to run. Its line, with our key and tools module in place
    of the placeholders, must compensate the call."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("toolledger executions compen")]
    done = await calls.completed("readme-comp")
    words = shlex.split(line.split(" #")[0])
    words = [{"r1:c7": done.key, "mypkg.tools": "tests.api_support"}.get(w, w) for w in words]
    code, out, err = await _cli(ledger_settings, *words[1:])
    assert code == 0, out + err
    assert "compensated" in out
