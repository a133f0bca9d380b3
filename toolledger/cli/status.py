"""`toolledger status`: a running deployment at a glance, for whoever operates it.

`toolledger dev status` says what runs on a developer's machine; this says how the ledger the
`TOOLLEDGER_*` settings name is doing, wherever it runs: each partition of the events topic with
the projector that owns it, when that owner last renewed its lease, its leader, how far it is
projected against the log's end (the lag), whether it is halted and why, and how many runs are
paused (and how many of those their resume hook could not resume). It reads PostgreSQL and
Kafka only (`toolledger.projections.deployment`), so it answers while projectors are down too.

Exit status (docs/architecture.md, "Errors and exit statuses"): 0 when nothing needs anyone,
1 when something does (a partition without an owner, one whose owner stopped renewing its
lease, a halted one, a run not resumed: each is
listed), 2 for a bad setting, 3 when PostgreSQL or Kafka does not answer, 4 when the events
topic is missing. `--json` prints the same for scripts.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING

import click
from rich.table import Table

from toolledger.cli.entry import console
from toolledger.errors import ExitStatus

if TYPE_CHECKING:
    from toolledger.projections.deployment import DeploymentStatus


async def _read() -> DeploymentStatus:
    import asyncpg

    from toolledger.events.kafka import KafkaLog
    from toolledger.events.log import LogError
    from toolledger.projections.deployment import read_status
    from toolledger.projections.migrations import migrate, quote_ident
    from toolledger.settings import load_settings

    settings = load_settings()
    database_url, bootstrap = settings.require_services()
    log = KafkaLog(bootstrap, settings.events_topic)
    await log.start()
    try:
        count = await log.partition_count()
        try:
            ends: dict[int, int] | None = await log.end_offsets()
        except LogError:
            ends = None  # shown as unknown; the positions and owners still are
        conn = await asyncpg.connect(
            database_url, server_settings={"search_path": quote_ident(settings.schema_name)}
        )
        try:
            await migrate(conn, settings.schema_name, create=False)  # a typo is not a ledger
            return await read_status(conn, settings.schema_name, log.topic, count, ends)
        finally:
            await conn.close()
    finally:
        await log.close()


def _table(status: DeploymentStatus) -> Table:
    table = Table(title=f"{status.topic} (ledger schema {status.schema})")
    columns = ("partition", "owner", "lease", "leader", "projected to", "log end", "lag", "state")
    for column in columns:
        table.add_column(column, justify="right" if column in ("partition", "lag") else "left")
    for p in status.partitions:
        state = "ok"
        if p.halted is not None:
            state = f"[red]HALTED[/red]: {p.halted}"
        elif p.lease is not None and p.lease.stale:
            state = "[red]STALE LEASE[/red]: its owner stopped renewing"
        elif p.owner is None:
            state = "[yellow]no owner[/yellow]"
        table.add_row(
            str(p.partition),
            p.owner or "-",
            "-" if p.lease is None else f"renewed {p.lease.age_s:.1f}s ago ({p.lease.lease_s:g}s)",
            p.leader or "-",
            "-" if p.next_offset is None else str(p.next_offset),
            "?" if p.end_offset is None else str(p.end_offset),
            "?" if p.lag is None else str(p.lag),
            state,
        )
    return table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON, for scripts.")
def status(as_json: bool) -> None:
    """Show a running deployment: partitions, owners, leaders, lag, halts, paused runs."""
    found = asyncio.run(_read())
    out = console()
    if as_json:
        click.echo(json.dumps(found.as_json(), indent=2))
    else:
        out.print(_table(found))
        paused = ", ".join(f"{n} {s}" for s, n in sorted(found.paused_runs.items())) or "none"
        out.print(f"paused runs: {paused}; not resumed (resume hook failed): {found.not_resumed}")
        for problem in found.problems:
            out.print(f"[red]needs you:[/red] {problem}", highlight=False)
    if found.problems:
        sys.exit(ExitStatus.NO)
