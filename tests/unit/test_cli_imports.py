"""`toolledger --help` and every `--help` below it must not import the server-side libraries.

Help used to take two seconds because every command's module imported faust, FastAPI,
aiokafka and asyncpg at load, whether the command ran or not. The group now loads a command's
module only when it is looked up (`toolledger.cli.COMMANDS`), and the modules import the heavy
libraries inside the commands. This runs every help screen in one fresh interpreter and says
which screen first pulled in which library.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("faust", "fastapi", "aiokafka", "asyncpg")

_WALK = """
import json, sys
import click
from toolledger.cli import main

HEAVY = %r

def paths(command, prefix):
    yield prefix
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from paths(command.get_command(ctx, name), [*prefix, name])

culprits = {}
screens = 0
main(["--help"], prog_name="toolledger", standalone_mode=False)
root = sorted(m for m in sys.modules if m.startswith("toolledger.cli."))
for path in paths(main, []):
    try:
        main([*path, "--help"], prog_name="toolledger", standalone_mode=False)
    except SystemExit:
        pass
    screens += 1
    for heavy in HEAVY:
        if heavy in sys.modules and heavy not in culprits:
            culprits[heavy] = " ".join(["toolledger", *path, "--help"])
found = {"screens": screens, "culprits": culprits, "root": root}
print(json.dumps(found), file=sys.__stderr__)
"""


def test_no_help_screen_imports_faust_fastapi_aiokafka_or_asyncpg() -> None:
    """A `--help` that imported faust or FastAPI took two seconds and needed the server
    extras installed; it must load click and the command's own module, nothing heavier."""
    walk = subprocess.run(
        [sys.executable, "-c", _WALK % (HEAVY,)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(walk.stderr.strip().splitlines()[-1])
    assert found["screens"] >= 30, found
    assert found["culprits"] == {}, f"help screens that imported server libraries: {found}"
    # The top-level help lists the kept summaries: it loads no command's module at all.
    assert found["root"] == ["toolledger.cli.entry", "toolledger.cli.tracing"], found


def test_the_summaries_the_group_lists_are_each_commands_own() -> None:
    """`toolledger --help` lists summaries kept beside the module names (so that it imports
    no command's module); a docstring changed without them would show a stale line."""
    import click

    from toolledger.cli import COMMANDS, main

    ctx = click.Context(main)
    for name, (_, summary) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert command.get_short_help_str(limit=1000) == summary, name


def test_the_top_level_help_lists_every_command_in_the_order_a_user_meets_them() -> None:
    """The lazy group must still list every command, in `COMMANDS` order, with its summary."""
    from toolledger.cli import COMMANDS

    shown = subprocess.run(
        [sys.executable, "-m", "toolledger", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    listed = [line.split()[0] for line in shown.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMANDS)
    assert "Kill runtimes, projectors and reconcilers" in shown


def test_the_reconcilers_help_says_a_group_must_share_its_tools() -> None:
    """Reconcilers with different --tools in one group split its partitions: a call of a tool
    one member lacks is never asked about in that member's partitions. Nothing said so."""
    from click.testing import CliRunner

    from toolledger.cli import main

    shown = CliRunner().invoke(main, ["reconciler", "--help"], terminal_width=200).output
    assert "same --tools" in " ".join(shown.split())
    assert "must load the same modules" in " ".join(shown.split())
