"""The `toolledger` command: one click group, each subcommand in its own module.

A module under `toolledger/cli/` defines its group or command and is registered here with
`main.add_command`, in the order a user meets the commands (help lists them in that order, not
alphabetically), so adding a command never means editing another command's module. What every
command shares (logging, exit statuses, running a faust worker) is in `toolledger.cli.entry`.
"""

from __future__ import annotations

import click

from toolledger.cli import entry
from toolledger.cli.analytics import analytics
from toolledger.cli.api import api
from toolledger.cli.demo import demo
from toolledger.cli.dev import dev
from toolledger.cli.drill import drill
from toolledger.cli.executions import executions
from toolledger.cli.keys import keys
from toolledger.cli.ledger import audit_command, dead_letters, history, replay_command
from toolledger.cli.mcp import mcp
from toolledger.cli.projector import projector
from toolledger.cli.reconciler import reconciler
from toolledger.cli.resumer import resumer
from toolledger.cli.server import server
from toolledger.cli.tokens import tokens
from toolledger.cli.tracing import configure_tracing


class _InOrderGroup(click.Group):
    """A group whose help lists commands in registration order, and which turns the errors its
    commands let escape into one line on stderr and the exit status of `entry.exit_status`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            if not entry.handled(exc):
                raise
            click.echo(f"toolledger {ctx.invoked_subcommand}: {entry.message(exc)}", err=True)
            raise click.exceptions.Exit(entry.exit_status(exc)) from exc


@click.group(cls=_InOrderGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolledger")
@click.pass_context
def main(ctx: click.Context) -> None:
    """toolledger: make an AI agent's tool calls take effect once, and say so when unknown.

    Spans go where OTEL_TRACES_EXPORTER says (none, console, otlp; docs/tracing.md).
    """
    entry.configure_logging()
    configure_tracing(ctx.invoked_subcommand or "cli")


main.add_command(demo)
main.add_command(dev)
main.add_command(server)
main.add_command(projector)
main.add_command(reconciler)
main.add_command(resumer)
main.add_command(analytics)
main.add_command(api)
main.add_command(mcp)
main.add_command(tokens)
main.add_command(keys)
main.add_command(executions)
main.add_command(history)
main.add_command(dead_letters)
main.add_command(replay_command)
main.add_command(audit_command)
main.add_command(drill)

__all__ = ["main"]
