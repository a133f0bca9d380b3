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
        if not isinstance(command, click.Group) or word not in command.commands:
            break
        command = command.commands[word]
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
