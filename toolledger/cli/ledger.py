"""`toolledger history | dead-letters | replay | audit`: read the ledger, prove it equals the log.

They read PostgreSQL and Kafka as configured by `TOOLLEDGER_*`: `history` and `audit` wait
at the read barrier first, so they show every event acknowledged before they were asked. Output
is rich tables for people; `replay --verify` exits 0 only when the re-fold is identical. A
replay or an `audit --as-of` folds in memory unless `--into` names a new schema.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from toolledger.audit import as_of_targets, story
from toolledger.cli import entry
from toolledger.cli.entry import ExitStatus
from toolledger.events.fold import HistoryEntry, broken_chains
from toolledger.events.records import UNSETTLED
from toolledger.events.signing import VerifyKeys
from toolledger.port import CallQuery
from toolledger.projections.fresh import LedgerReads
from toolledger.projections.memory import MemoryLedger
from toolledger.projections.replay import (
    ReplayReport,
    ReplayTargetInUse,
    compare,
    copy_blobs,
    replay,
)
from toolledger.projections.store import LedgerStore
from toolledger.settings import ProjectorSettings, Settings, load_settings
from toolledger.wiring.reading import reading

if TYPE_CHECKING:
    from toolledger.events.kafka import KafkaLog
    from toolledger.projections.postgres import PostgresLedger

# The Kafka log and the PostgreSQL ledger (aiokafka, asyncpg) are imported by the commands that
# read them: `--help` must not load them.

_console = entry.console()
_T = TypeVar("_T")


class _Instant(click.ParamType):
    """A moment as toolledger prints it: ISO 8601, with or without milliseconds, with `Z`, an
    offset or nothing (UTC); returned in UTC."""

    name = "TIMESTAMP"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            moment = value
        else:
            try:
                moment = datetime.fromisoformat(str(value).strip())
            except ValueError:
                self.fail(
                    f"{value!r} is not a timestamp: give it as toolledger prints them, e.g. "
                    "2026-03-01T14:02:07.123Z, 2026-03-01T15:02:07+01:00 or 2026-03-01 14:02:07 "
                    "(UTC)",
                    param,
                    ctx,
                )
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _replay_target(into: str, exc: ReplayTargetInUse) -> entry.CommandFailed:
    return entry.CommandFailed(
        f"schema {into} already holds a projection, and --into needs a new, empty one: pick "
        f"another name (e.g. --into {into}_2), or drop it first ({exc})",
        ExitStatus.USAGE,
    )


def _run(body: Callable[[ProjectorSettings], Coroutine[object, object, _T]]) -> _T:
    """These commands read the ledger or re-fold the log: the shared block plus the public
    keys (a replay judges operator signatures as a projector does)."""
    return asyncio.run(body(load_settings(ProjectorSettings)))


async def _store(settings: Settings, schema: str | None = None) -> PostgresLedger:
    """The live ledger (`schema` None: read only, no keys) or a replay target (with keys)."""
    from toolledger.projections.postgres import PostgresLedger

    database_url, _ = settings.require_services()
    keys = VerifyKeys()
    if schema is not None and isinstance(settings, ProjectorSettings):
        keys = settings.require_verify_keys()
    store = PostgresLedger(
        database_url, schema or settings.schema_name, verify_keys=keys, create=schema is not None
    )
    await store.start()
    return store


async def _run_history(store: LedgerReads, run_id: str) -> list[HistoryEntry]:
    """A run's own events and those of every call it made, in log order.

    A run driven by `AgentRun` has events of its own (started, checkpointed, ...); one that used
    the ledger bare has only its calls', and a run id must show those too.
    """
    entries = list(await store.history(run_id))
    after: tuple[datetime, str] | None = None
    while True:
        page = await store.list_calls(CallQuery(tenant_id=None, run_id=run_id, after=after))
        for found in await asyncio.gather(*(store.history(call.key) for call in page)):
            entries.extend(found)
        if len(page) < CallQuery.limit:
            break
        after = (page[-1].updated_at, page[-1].key)
    return sorted(entries, key=lambda h: (h.partition, h.offset))


@click.command()
@click.argument("key")
def history(key: str) -> None:
    """Print every event of KEY (a call key run:call, or a run id: the run's events and its
    calls') from the ledger history.

    The chain column starts each entry's hash chain link; a broken link is reported below."""

    async def body(settings: Settings) -> int:
        async with reading(settings) as opened:
            reads = opened.reads
            is_call = ":" in key
            entries = await reads.history(key) if is_call else await _run_history(reads, key)
            record = await reads.get_call(key) if is_call else None
        if not entries:
            _console.print(f"[yellow]no history for {key}[/yellow]")
            return ExitStatus.NO
        table = Table(title=f"history of {key}")
        columns = ["offset", "occurred at", "event", "actor", "verdict", "version", "detail"]
        if not is_call:
            columns.insert(2, "key")
        for col in columns:
            # Ids (keys, event names, actors) are never split over lines; the detail wraps.
            table.add_column(col, overflow="fold", no_wrap=col != "detail")
        table.add_column("chain", no_wrap=True)
        for h in entries:
            verdict = "[green]accepted[/green]" if h.accepted else f"[red]{h.reason}[/red]"
            table.add_row(
                f"{h.partition}/{h.offset}",
                h.occurred_at.isoformat(timespec="milliseconds"),
                *([] if is_call else [h.key]),
                h.event_type,
                h.actor,
                verdict,
                "" if h.version is None else str(h.version),
                h.detail,
                h.chain_hash[:12],
            )
        _console.print(table)
        for line in broken_chains(entries):
            _console.print(f"[red]{line}[/red]", soft_wrap=True)
        if record is not None:
            _console.print(f"now: [bold]{record.status}[/bold] (version {record.version})")
        return ExitStatus.OK

    sys.exit(_run(body))


@click.group("dead-letters")
def dead_letters() -> None:
    """Records of toolledger.events that could not be read."""


@dead_letters.command("list")
def dead_letters_list() -> None:
    """List dead letters and the runs they quarantined."""

    async def body(settings: Settings) -> None:
        store = await _store(settings)
        try:
            letters = await store.dead_letters()
        finally:
            await store.close()
        table = Table(title=f"{len(letters)} dead letters")
        for col in ("partition/offset", "quarantined run", "reason", "bytes"):
            table.add_column(col)
        for d in letters:
            table.add_row(
                f"{d.partition}/{d.offset}", d.run_id or "-", d.reason, str(len(d.payload))
            )
        _console.print(table)

    _run(body)


@click.command("replay")
@click.option(
    "--into",
    "into",
    help="A new, empty PostgreSQL schema to fold into. Without it the fold is in memory and "
    "nothing is written: for checking the digest (--verify), not for serving the ledger.",
)
@click.option(
    "--verify", is_flag=True, help="Compare with the live ledger; exit 1 on any difference."
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes to fold the partitions (at most one per partition); the digest is "
    "the same whatever the number.",
)
def replay_command(into: str | None, verify: bool, processes: int) -> None:
    """Re-fold toolledger.events from offset 0 into a fresh schema or in memory (and compare
    with --verify)."""
    where = into or "memory"

    async def body(settings: ProjectorSettings) -> ReplayReport:
        from toolledger.events.kafka import KafkaLog
        from toolledger.projections.postgres import PostgresLedger
        from toolledger.projections.replay_processes import (
            replay_in_memory,
            replay_in_processes,
            replay_into_memory,
        )

        keys = settings.require_verify_keys()
        _console.print(
            f"verifying operator signatures with TOOLLEDGER_VERIFY_KEYS: {keys.describe()}",
            highlight=False,
        )
        database_url, bootstrap = settings.require_services()
        log = KafkaLog(bootstrap, settings.events_topic)
        await log.start()
        try:
            live = await _store(settings)
        except BaseException:
            await log.close()  # no producer left for the garbage collector to complain about
            raise
        fresh: LedgerStore | None = None
        try:
            fresh = await _store(settings, into) if into else MemoryLedger(verify_keys=keys)
            registered = await live.registered_keys()
            if registered != keys:
                _console.print(
                    "[yellow]the live ledger's projectors registered another key set: "
                    f"{registered.describe()}[/yellow]",
                    highlight=False,
                )
            identity = await log.identity()
            targets = {}
            for partition in range(identity.partitions):
                state = await live.partition_state(partition)
                targets[partition] = state.next_offset if state is not None else 1
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=_console,
            ) as bar:
                task = bar.add_task(f"replaying into {where}", total=None)

                def advance(done: int, total: int) -> None:
                    bar.update(task, advance=done, total=total)

                if processes == 1 and isinstance(fresh, MemoryLedger):
                    report = await replay_into_memory(log, fresh, targets=targets, progress=advance)
                elif processes == 1:
                    report = await replay(log, fresh, targets=targets, progress=advance)
                elif isinstance(fresh, PostgresLedger):
                    report = await replay_in_processes(
                        log,
                        fresh,
                        targets=targets,
                        processes=processes,
                        database_url=database_url,
                        bootstrap=bootstrap,
                        progress=advance,
                    )
                else:
                    fresh = None  # each worker folded into a memory ledger of its own
                    report = await replay_in_memory(
                        log,
                        verify_keys=keys,
                        targets=targets,
                        processes=processes,
                        bootstrap=bootstrap,
                        progress=advance,
                    )
            blob_problems = await copy_blobs(live, fresh) if into and fresh else []
            if verify:
                report.live_digest = await live.digest()
                if not report.identical:
                    report.differences = (
                        compare(await live.snapshot(), await fresh.snapshot())
                        if fresh is not None
                        else [
                            "the rows that differ are listed by a replay in one process "
                            "(--processes 1) or into a schema (--into)"
                        ]
                    )
                report.differences += blob_problems
            return report
        except ReplayTargetInUse as exc:
            raise _replay_target(str(into), exc) from exc
        finally:
            if fresh is not None:
                await fresh.close()
            await live.close()
            await log.close()

    report = _run(body)
    _console.print(
        f"replayed {report.events} events ({report.dead_letters} dead letters) into {where}; "
        f"digest {report.replay_digest[:16]}"
    )
    if not verify:
        return
    if report.identical:
        _console.print("[green]identical to the live ledger[/green]")
        return
    _console.print(f"[red]differs from the live ledger[/red] (live {str(report.live_digest)[:16]})")
    for line in report.differences:
        _console.print(f"  - {line}", soft_wrap=True)
    sys.exit(ExitStatus.NO)


@click.command("audit")
@click.argument("key", required=False)
@click.option("--run", "run_id", help="Tell the whole run's story instead of one key's.")
@click.option(
    "--as-of",
    type=_Instant(),
    help="Rebuild the ledger as it stood at this time, as toolledger prints times "
    "(2026-03-01T14:02:07.123Z, an offset, or none: UTC); in memory unless --into.",
)
@click.option("--into", help="A new, empty schema to rebuild the ledger into for --as-of.")
def audit_command(
    key: str | None, run_id: str | None, as_of: datetime | None, into: str | None
) -> None:
    """KEY's (or --run's) story from the log itself: every request, its actor and its verdict."""
    if key is None and run_id is None:
        raise click.UsageError("give a KEY (run:call) or --run RUN")
    if into is not None and as_of is None:
        raise click.UsageError("--into is where --as-of rebuilds the ledger: give --as-of too")
    run = run_id or str(key).split(":", 1)[0]

    async def body(settings: ProjectorSettings) -> int:
        async with reading(settings) as opened:
            if as_of is not None:
                return await _as_of(opened.log, settings, as_of, into, key)
            # The log is read to its end; the verdicts of what it holds, once committed.
            await opened.reads.barrier.wait((run,))
            entries = await story(opened.log, opened.reads.store, run_id=run, key=key)
        table = Table(title=f"story of {key or run} (from {settings.events_topic})")
        for col in ("offset", "appended", "event", "key", "actor", "verdict", "detail"):
            table.add_column(col, no_wrap=col != "detail")
        for e in entries:
            v = e.verdict
            verdict = (
                "[yellow]no verdict[/yellow]"
                if v is None
                else ("[green]accepted[/green]" if v.accepted else f"[red]{v.reason}[/red]")
            )
            table.add_row(
                f"{e.partition}/{e.offset}",
                e.appended_at.isoformat(timespec="milliseconds"),
                e.event.type,
                e.event.key,
                e.actor,
                verdict,
                "" if v is None else v.detail,
            )
        _console.print(table)
        return ExitStatus.OK if entries else ExitStatus.NO

    sys.exit(_run(body))


async def _as_of(
    log: KafkaLog, settings: ProjectorSettings, as_of: datetime, into: str | None, key: str | None
) -> int:
    """Fold the log up to `as_of` into `into` (None: in memory, as `replay` does)."""
    fresh: LedgerStore = (
        await _store(settings, into)
        if into
        else MemoryLedger(verify_keys=settings.require_verify_keys())
    )
    try:
        targets = await as_of_targets(log, as_of)
        try:
            report = await replay(log, fresh, targets=targets)
        except ReplayTargetInUse as exc:
            raise _replay_target(str(into), exc) from exc
        where = f"into schema {into}" if into else "in memory"
        _console.print(
            f"rebuilt the ledger as of {as_of.isoformat(timespec='milliseconds')} {where}: "
            f"{report.events} events"
        )
        if key is not None:
            record = await fresh.get_call(key)
            if record is None:
                _console.print(f"{key} did not exist yet")
            else:
                settled = (
                    f", settled by {record.settled_by}"
                    if record.settled_by is not None and record.status not in UNSETTLED
                    else ", not settled"
                )
                _console.print(
                    f"{key} was [bold]{record.status}[/bold] (version {record.version}{settled})"
                )
    finally:
        await fresh.close()
    return 0
