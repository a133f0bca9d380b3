"""`toolledger tokens create | list | revoke`: the operator API's bearer tokens.

Tokens live hashed in the ledger's PostgreSQL schema (`api_tokens`), so these commands need only
`TOOLLEDGER_DATABASE_URL` (and `TOOLLEDGER_SCHEMA`). `create` prints the token once: it is not
stored and cannot be shown again; `list` shows ids, scopes and states; `revoke ID` ends a token
at once (the API checks every request against the table).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import click
from rich.table import Table

from toolledger.api.tokens import ROLES, PostgresTokens
from toolledger.cli import entry
from toolledger.cli.entry import ExitStatus

_console = entry.console()
_T = TypeVar("_T")
_TTL = re.compile(r"^(\d+)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> timedelta:
    """`90d`, `12h`, `30m`, `45s` or plain seconds."""
    match = _TTL.match(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise click.BadParameter(
            f"{text!r} is not a positive duration like 90d, 12h, 30m or 3600", param_hint="--ttl"
        )
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def _run(body: Callable[[PostgresTokens], Coroutine[Any, Any, _T]]) -> _T:
    from toolledger.errors import ConfigError
    from toolledger.settings import load_settings

    async def main() -> _T:
        settings = load_settings()
        if not settings.database_url:
            raise ConfigError(
                "TOOLLEDGER_DATABASE_URL must be set (or run `toolledger dev up` for a local stack)"
            )
        store = PostgresTokens(settings.database_url, settings.schema_name)
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())


@click.group()
def tokens() -> None:
    """Bearer tokens of the operator API (stored hashed in PostgreSQL)."""


@tokens.command("create")
@click.option("--tenant", required=True, help="The only tenant the token can see and act on.")
@click.option("--operator", required=True, help="Operator id recorded on its decisions.")
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="operator",
    show_default=True,
    help="viewer reads; operator also resolves, approves, rejects, compensates; admin: all.",
)
@click.option("--ttl", default="30d", show_default=True, help="Lifetime: 90d, 12h, 30m, 3600.")
def create_command(tenant: str, operator: str, role: str, ttl: str) -> None:
    """Create a token and print it once."""
    lifetime = parse_ttl(ttl)
    chosen = next(r for r in ROLES if r == role)
    issued = _run(lambda store: store.create(tenant, operator, chosen, lifetime))
    record = issued.record
    click.echo(issued.token)
    click.echo(
        f"token {record.token_id}: tenant {record.tenant_id}, operator {record.operator}, role "
        f"{record.role}, expires {record.expires_at.isoformat(timespec='seconds')}. It is shown "
        "only now; store it as a secret.",
        err=True,
    )


@tokens.command("list")
@click.option("--tenant", default=None, help="Only this tenant's tokens.")
def list_command(tenant: str | None) -> None:
    """List tokens (never the tokens themselves: only their ids and scopes)."""
    from toolledger.events.models import utcnow

    found = _run(lambda store: store.list_tokens(tenant))
    now = utcnow()
    table = Table(title=f"{len(found)} API tokens")
    for column in ("id", "tenant", "operator", "role", "created", "expires", "state"):
        table.add_column(column)
    for r in found:
        state = r.state(now)
        colour = {"active": "green", "expired": "yellow", "revoked": "red"}[state]
        table.add_row(
            r.token_id,
            r.tenant_id,
            r.operator,
            r.role,
            r.created_at.isoformat(timespec="seconds"),
            r.expires_at.isoformat(timespec="seconds"),
            f"[{colour}]{state}[/{colour}]",
        )
    _console.print(table)


@tokens.command("revoke")
@click.argument("token_id")
def revoke_command(token_id: str) -> None:
    """Revoke the token TOKEN_ID (from `tokens list`); it stops working at once."""
    record = _run(lambda store: store.revoke(token_id))
    if record is None:
        click.echo(f"no token {token_id}; see `toolledger tokens list`", err=True)
        sys.exit(ExitStatus.NO)
    assert record.revoked_at is not None
    click.echo(f"token {record.token_id} revoked at {record.revoked_at.isoformat()}")
