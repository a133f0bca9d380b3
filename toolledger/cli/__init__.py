"""The `toolledger` command: one click group, each subcommand in its own module.

A module under `toolledger/cli/` defines its group or command and is named here in `COMMANDS`,
in the order a user meets the commands (help lists them in that order, not alphabetically), so
adding a command never means editing another command's module. What every command shares
(logging, exit statuses, running a faust worker) is in `toolledger.cli.entry`.

The group is lazy (click's "lazily loading subcommands" pattern): a command's module is
imported only when that command is looked up, and the modules import the heavy libraries
(faust, FastAPI, aiokafka, asyncpg) inside the commands that need them, so `toolledger --help`
and every `--help` below it stay fast (`tests/unit/test_cli_imports.py` holds them to that).
"""

from __future__ import annotations

import importlib

import click
from click.utils import make_default_short_help

from toolledger.cli import entry
from toolledger.cli.tracing import configure_tracing

#: Command name -> ("module:attribute", its one-line summary), in the order a user meets them.
#: `toolledger --help` lists the summaries without importing any command's module;
#: `tests/unit/test_cli_imports.py` checks each against the command's own docstring.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "toolledger.cli.demo:demo",
        "Run an example: billing reconciliation (default) or Penny the refund bot.",
    ),
    "dev": (
        "toolledger.cli.dev:dev",
        "Run PostgreSQL and a Kafka broker for development and tests.",
    ),
    "migrate": (
        "toolledger.cli.migrate:migrate",
        "Create the ledger's PostgreSQL schema (TOOLLEDGER_SCHEMA) or apply pending migrations.",
    ),
    "server": (
        "toolledger.cli.server:server",
        "Run every server role: projector, reconciler, resumer, API and console (TOOLLEDGER_*).",
    ),
    "status": (
        "toolledger.cli.status:status",
        "Show a running deployment: partitions, owners, leaders, lag, halts, paused runs.",
    ),
    "projector": (
        "toolledger.cli.projector:projector",
        "Fold toolledger.events into the PostgreSQL ledger (configured by TOOLLEDGER_*).",
    ),
    "reconciler": (
        "toolledger.cli.reconciler:reconciler",
        "Settle unknown calls with their tools' reconcile hooks (configured by TOOLLEDGER_*).",
    ),
    "resumer": (
        "toolledger.cli.resumer:resumer",
        "Resume paused runs when the call they wait on is settled (facts topic, faust).",
    ),
    "analytics": (
        "toolledger.cli.analytics:analytics",
        "Count calls by tenant, tool and status; rate unknown and compensated calls per minute.",
    ),
    "api": (
        "toolledger.cli.api:api",
        "Serve the operator HTTP API (OpenAPI at /openapi.json), configured by TOOLLEDGER_*.",
    ),
    "mcp": (
        "toolledger.cli.mcp:mcp",
        "Serve toolsets to MCP clients, each call made once through the ledger.",
    ),
    "tokens": (
        "toolledger.cli.tokens:tokens",
        "Bearer tokens of the operator API (stored hashed in PostgreSQL).",
    ),
    "keys": ("toolledger.cli.keys:keys", "Operator signing keys (Ed25519)."),
    "executions": (
        "toolledger.cli.executions:executions",
        "Inspect and settle tool executions: the operator queue (configured by TOOLLEDGER_*).",
    ),
    "history": (
        "toolledger.cli.ledger:history",
        "Print every event of KEY (a call key run:call, or a run id: the run's events and its "
        "calls') from the ledger history.",
    ),
    "dead-letters": (
        "toolledger.cli.ledger:dead_letters",
        "Records of toolledger.events that could not be read.",
    ),
    "replay": (
        "toolledger.cli.ledger:replay_command",
        "Re-fold toolledger.events from offset 0 into a fresh schema or in memory (and compare "
        "with --verify).",
    ),
    "audit": (
        "toolledger.cli.ledger:audit_command",
        "KEY's (or --run's) story from the log itself: every request, its actor and its verdict.",
    ),
    "drill": (
        "toolledger.cli.drill:drill",
        "Kill runtimes, projectors and reconcilers at random points, then check the ledger.",
    ),
}


class _LazyGroup(click.Group):
    """A group that imports a command's module when the command is looked up, lists commands
    in `COMMANDS` order, and turns the errors its commands let escape into one line on stderr
    and the exit status of `entry.exit_status`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return self.commands.get(cmd_name)
        where = COMMANDS[cmd_name][0]
        module, _, attribute = where.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{where} is not a click command")
        self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own layout (`Group.format_commands`), from the kept summaries.
        summaries = {name: summary for name, (_, summary) in COMMANDS.items()}
        summaries.update(
            (n, c.help or c.short_help or "") for n, c in self.commands.items() if n not in COMMANDS
        )
        limit = formatter.width - 6 - max(map(len, summaries))
        rows = [(n, make_default_short_help(text, limit)) for n, text in summaries.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # click's own (--help, a bad option): it prints them itself
        except Exception as exc:
            if not entry.handled(exc):
                raise
            click.echo(f"toolledger {ctx.invoked_subcommand}: {entry.message(exc)}", err=True)
            raise click.exceptions.Exit(entry.exit_status(exc)) from exc


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolledger")
@click.pass_context
def main(ctx: click.Context) -> None:
    """toolledger: make an AI agent's tool calls take effect once, and say so when unknown.

    Spans go where OTEL_TRACES_EXPORTER says (none, console, otlp; docs/tracing.md).
    """
    entry.configure_logging()
    configure_tracing(ctx.invoked_subcommand or "cli")


__all__ = ["COMMANDS", "main"]
