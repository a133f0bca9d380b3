"""The README's code runs as written: a newcomer's first program must not fail on line one.

So does the code of the framework pages (docs/integrations/*.md): the LangGraph page's
"complete program" once used an undefined `chat_model`, `saver` and `Command`.

Every ```python block runs in a fresh interpreter from the repository root, unless the line
before it is an HTML comment `<!-- not run: why -->` (a block that needs services, or a
fragment). Shell blocks are not run (they start servers), but every `toolledger ...` command
they name must exist (`--help` answers) and every `make` target must be in the Makefile.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from toolledger.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "integrations").glob("*.md"))]
_BLOCK = re.compile(
    r"(?:^<!-- (?P<mark>[^>]*) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S
)


def _blocks(lang: str) -> list[tuple[str | None, str]]:
    return [
        (m["mark"], m["body"])
        for page in PAGES
        for m in _BLOCK.finditer(page.read_text())
        if m["lang"] == lang
    ]


def _runnable_python() -> list[str]:
    blocks = []
    for mark, body in _blocks("python"):
        if mark is not None:
            assert mark.startswith("not run: "), f"unknown README mark {mark!r}"
            continue
        blocks.append(body)
    return blocks


def _command_lines() -> list[list[str]]:
    lines = []
    for _, body in _blocks("sh"):
        for line in body.splitlines():
            words = shlex.split(line.split(" #")[0].rstrip(" &"), comments=True)
            if words and words[0] in ("toolledger", "make"):
                lines.append(words)
    return lines


def test_the_readme_has_a_runnable_python_program() -> None:
    assert _runnable_python(), "the README's first example must run as written"


@pytest.mark.parametrize("code", _runnable_python(), ids=lambda code: code.splitlines()[0])
def test_each_python_block_runs_as_written(code: str) -> None:
    """The "Twenty lines" example once used an undefined `client` and a top-level `async with`."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _command_path(words: list[str]) -> list[str]:
    command: click.Command = main
    path: list[str] = []
    for word in words[1:]:
        # `get_command`, not `.commands`: the group loads a command's module when looked up.
        found = (
            command.get_command(click.Context(command), word)
            if isinstance(command, click.Group)
            else None
        )
        if found is None:
            break
        command = found
        path.append(word)
    return path


@pytest.mark.parametrize("words", _command_lines(), ids=shlex.join)
def test_each_command_the_readme_names_exists(words: list[str]) -> None:
    if words[0] == "make":
        targets = re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M)
        assert words[1] in targets, f"make {words[1]} is not a Makefile target"
        return
    path = _command_path(words)
    assert path, f"{shlex.join(words)}: {words[1]} is not a toolledger command"
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output


def test_make_help_describes_the_demo_that_exists() -> None:
    """`make help` said the demo "arrives later" long after it had arrived."""
    done = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    demo = next(line for line in done.stdout.splitlines() if line.startswith("make demo"))
    assert "later" not in demo and "billing demo" in demo


# The README's `Operator` fragment, run as printed inside a scene that gives it what the
# README's own examples define: a `ledger`, the `billing` toolset and a `credit` (a dataclass).
_OPERATOR_FRAGMENT = "olivia = Operator(ledger"
_SCENE = """
import asyncio
from dataclasses import dataclass

from toolledger import Ledger, ToolCallAwaitingApproval, ToolCallIndeterminate, ToolContext
from toolledger import ToolExecutionRecord, Toolset, external


@dataclass
class Credit:
    id: str
    amount_cents: int


billing = Toolset("billing")
voided = []


async def void_credit(record: ToolExecutionRecord, context: ToolContext) -> None:
    voided.append(record.idempotency_key)


@billing.tool(external(), compensation=void_credit)
async def issue_credit(account_id: str, amount_cents: int, context: ToolContext) -> Credit:
    async with context.sending():
        raise TimeoutError("the billing API did not answer")


@billing.tool(external(approval=True))
async def close_account(account_id: str, context: ToolContext) -> str:
    return "closed"


async def main() -> None:
    async with await Ledger.memory() as ledger:
        args = {"account_id": "acct-42", "amount_cents": 2500}
        try:
            await ledger.call(
                issue_credit, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments=args
            )
        except ToolCallIndeterminate:
            pass  # the paused run's unknown call, which olivia settles
        try:
            await ledger.call(
                close_account,
                run_id="r1",
                tool_call_id="c2",
                tenant_id="acme",
                arguments={"account_id": "acct-42"},
            )
        except ToolCallAwaitingApproval:
            pass  # the call olivia approves
        credit = Credit(id="cr-1", amount_cents=2500)
{fragment}
        c1, c2 = await ledger.read_call("r1:c1"), await ledger.read_call("r1:c2")
        assert (c1.status, c1.result_json) == ("compensated", '{"amount_cents":2500,"id":"cr-1"}')
        assert c2.status == "approved" and voided == ["r1:c1"], (c2, voided)
        print("fragment ran")


asyncio.run(main())
"""


def test_the_operator_fragment_runs_as_written() -> None:
    """The fragment once failed as printed: `value=credit` (the README's `Credit` dataclass)
    was refused as "not plain JSON", and `tools=[billing]` (a list holding a Toolset) was
    taken, then `compensate` failed asking for --tools."""
    (fragment,) = [body for _, body in _blocks("python") if _OPERATOR_FRAGMENT in body]
    indented = "\n".join(f"        {line}" if line else "" for line in fragment.splitlines())
    program = _SCENE.replace("{fragment}", indented)
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "fragment ran"
