"""`toolledger dev up | status | down`: the local PostgreSQL and Kafka for development.

A thin shell over `toolledger.devstack`, which the pytest fixtures use too, so a stack brought up
here is the one `make test` and the examples find. Output is for people: a table of what runs
where, and the `export` lines that point other shells at it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table

from toolledger.cli import entry
from toolledger.devstack import (
    DATABASE_URL_ENV,
    KAFKA_BOOTSTRAP_ENV,
    DevStack,
    Services,
    ServiceStatus,
)

_console = entry.console()
_SOURCES = {
    "env": "env var",
    "local": "local server",
    "embedded": "embedded (ours)",
    "tansu": "tansu (ours)",
}

_project_dir = click.option(
    "--project-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory whose .toolledger/ holds the stack's state.",
)


class _InOrderGroup(click.Group):
    """Lists `up`, `status`, `down` in the order a user runs them, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=_InOrderGroup)
def dev() -> None:
    """Run PostgreSQL and a Kafka broker for development and tests."""


@dev.command()
@_project_dir
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait per service.")
def up(project_dir: Path, timeout: float) -> None:
    """Find or start PostgreSQL and Kafka (reuses a running stack)."""
    stack = DevStack(project_dir, startup_timeout=timeout)
    with _console.status("Starting PostgreSQL and Kafka..."):
        services = stack.up()
    statuses = stack.status()
    _console.print(_table(statuses))
    _print_logs(statuses)
    _print_exports(services)


@dev.command()
@_project_dir
@click.option("--check", is_flag=True, help="Print nothing; exit 0 if a stack runs here, 1 if not.")
def status(project_dir: Path, check: bool) -> None:
    """Show what runs where, and whether each process is alive."""
    stack = DevStack(project_dir)
    if check:
        sys.exit(0 if stack.services() is not None else 1)
    statuses = stack.status()
    if not statuses:
        _console.print(f"No dev stack in {stack.project_dir}: run `toolledger dev up`.")
        return
    _console.print(_table(statuses))
    _print_logs(statuses)
    live = stack.services()
    if live is not None:
        _print_exports(live)


@dev.command()
@_project_dir
def down(project_dir: Path) -> None:
    """Stop what `up` started; servers it found running are left alone."""
    stopped = DevStack(project_dir).down()
    if not stopped:
        _console.print("Nothing to stop.")
    for service in stopped:
        _console.print(f"Stopped {service.name} ({service.source}, pid {service.pid}).")


def _table(statuses: list[ServiceStatus]) -> Table:
    table = Table(title="toolledger dev stack")
    table.add_column("service", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("address", overflow="fold")
    table.add_column("pid", no_wrap=True)
    table.add_column("process", no_wrap=True)
    table.add_column("answers", no_wrap=True)
    for st in statuses:
        s = st.service
        alive = {None: "-", True: "[green]alive[/]", False: "[red]gone[/]"}[st.process_alive]
        table.add_row(
            s.name,
            _SOURCES[s.source],
            s.address,
            str(s.pid) if s.pid is not None else "-",
            alive,
            "[green]yes[/]" if st.answers else "[red]no[/]",
        )
    return table


def _print_logs(statuses: list[ServiceStatus]) -> None:
    for st in statuses:
        if st.service.log is not None:
            _console.print(f"{st.service.name} log: {st.service.log}", highlight=False)


def _print_exports(services: Services) -> None:
    _console.print(f"export {DATABASE_URL_ENV}={services.database_url}", highlight=False)
    _console.print(f"export {KAFKA_BOOTSTRAP_ENV}={services.kafka_bootstrap}", highlight=False)
