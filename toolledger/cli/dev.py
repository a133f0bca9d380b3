"""`toolledger dev up | status | down`: the local PostgreSQL and Kafka for development.

A thin shell over `toolledger.devstack`, which the pytest fixtures use too, so a stack brought up
here is the one `make test` and the examples find. Output is for people: a table of what runs
where, and the `export` lines that point other shells at it, per role (docs/security.md): the
shared block every process needs, the public keys projectors add, the private key only the API
and the operator CLI add.

`up` also makes a development signing key pair, once, in `.toolledger/dev-signing.key` (mode
0600; `down` leaves it, because a ledger schema that outlives the stack keeps verifying with its
public key: projectors refuse to start with a key set that lost one).

Each checkout gets its own schema and topic prefix (`toolledger.devstack.checkout_namespace`),
printed with the exports, so two checkouts on one machine never share a ledger. Every command
finds the checkout from any directory below it, or from `--project-dir`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import sys
from pathlib import Path

import click
from rich.table import Table

from toolledger.cli import entry
from toolledger.devstack import (
    DATABASE_URL_ENV,
    DEV_KAFKA_ENV,
    KAFKA_BOOTSTRAP_ENV,
    DevStack,
    Services,
    ServiceStatus,
    dev_kafka_choice,
    find_project_dir,
)
from toolledger.events.signing import SigningKey, parse_signing_keys

DEV_KEY_FILE = "dev-signing.key"
SCHEMA_ENV = "TOOLLEDGER_SCHEMA"
TOPIC_PREFIX_ENV = "TOOLLEDGER_TOPIC_PREFIX"
_console = entry.console()
_SOURCES = {
    "env": "env var",
    "local": "local server",
    "embedded": "embedded (ours)",
    "tansu": "tansu (ours)",
    "apache": "Apache Kafka (ours)",
}
_kafka = click.option(
    "--kafka",
    type=click.Choice(["apache", "tansu"]),
    default=None,
    help=f"The broker to start: `apache` (Apache Kafka, what `make test` runs; needs java and "
    f"mvn) or `tansu` (quick, in memory) [default: ${DEV_KAFKA_ENV}, else the broker already "
    "running, else tansu].",
)

_project_dir = click.option(
    "--project-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The checkout whose .toolledger/ holds the stack's state [default: the one around the "
    "working directory: the nearest with a .toolledger/, pyproject.toml or .git].",
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
@_kafka
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait per service.")
def up(project_dir: Path | None, kafka: str | None, timeout: float) -> None:
    """Find or start PostgreSQL and Kafka (reuses a running stack).

    A ledger schema of this checkout that was built from a log the broker no longer holds
    (tansu keeps nothing across a restart) is reset, and the output says so.
    """
    from toolledger.dev.schema import reset_if_log_gone  # asyncpg and aiokafka: only here

    stack = DevStack(
        project_dir or find_project_dir(),
        startup_timeout=timeout,
        kafka=dev_kafka_choice(kafka),
        progress=lambda line: _console.print(line, highlight=False),
    )
    with _console.status("Starting PostgreSQL and Kafka..."):
        services = stack.up()
        reset = asyncio.run(reset_if_log_gone(services, stack.namespace))
    statuses = stack.status()
    _console.print(_table(statuses))
    _print_logs(statuses)
    if reset is not None:
        _console.print(reset, highlight=False)
    _print_exports(services, stack)


@dev.command()
@_project_dir
@click.option("--check", is_flag=True, help="Print nothing; exit 0 if a stack runs here, 1 if not.")
@click.option(
    "--kafka",
    type=click.Choice(["apache", "tansu"]),
    default=None,
    help="With --check: exit 0 only if the stack's broker is this one.",
)
def status(project_dir: Path | None, check: bool, kafka: str | None) -> None:
    """Show what runs where, and whether each process is alive."""
    stack = DevStack(project_dir or find_project_dir())
    if check:
        runs = stack.services() is not None
        sys.exit(0 if runs and kafka in (None, stack.kafka_kind()) else 1)
    statuses = stack.status()
    if not statuses:
        _console.print(f"No dev stack in {stack.project_dir}: run `toolledger dev up`.")
        return
    _console.print(_table(statuses))
    _print_logs(statuses)
    live = stack.services()
    if live is not None:
        _print_exports(live, stack)


@dev.command()
@_project_dir
def down(project_dir: Path | None) -> None:
    """Stop what `up` started; servers it found running are left alone."""
    stack = DevStack(project_dir or find_project_dir())
    stopped = stack.down()
    if not stopped:
        _console.print(f"Nothing to stop in {stack.project_dir}.")
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


def dev_signing_key(home: Path) -> tuple[SigningKey, Path]:
    """The project's development key pair, made on first use; and the file holding it."""
    path = home / DEV_KEY_FILE
    if path.exists():
        [key] = parse_signing_keys(path.read_text().strip())
        return key, path
    home.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate(f"dev-{secrets.token_hex(3)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key.setting() + "\n")
    return key, path


def _print_exports(services: Services, stack: DevStack) -> None:
    key, path = dev_signing_key(stack.home)
    space = stack.namespace
    out = functools.partial(_console.print, highlight=False, soft_wrap=True)
    out("# every role (runtimes, reconciler, resumer, analytics, projector, API, CLI); the schema")
    out(f"# and topic prefix are this checkout's own ({stack.project_dir}):")
    out(f"export {DATABASE_URL_ENV}={services.database_url}")
    out(f"export {KAFKA_BOOTSTRAP_ENV}={services.kafka_bootstrap}")
    out(f"export {SCHEMA_ENV}={space.schema}")
    out(f"export {TOPIC_PREFIX_ENV}={space.topic_prefix}")
    out("# projectors and `toolledger replay`/`audit` add the public key:")
    out(f"export TOOLLEDGER_VERIFY_KEYS={key.public_setting()}")
    out(
        "# only the operator API and `toolledger executions` add the private key (never a runtime):"
    )
    out(f'export TOOLLEDGER_SIGNING_KEYS="$(cat {path})"')
