"""`toolledger executions list | show | resolve | approve | reject | compensate`.

The operator queue from a shell, on the same `OperatorService` as the HTTP API, so a decision
made here is signed, compare-and-set and recorded exactly like one made over HTTP. The CLI acts
as an admin with database access:

- `--operator` (env `TOOLLEDGER_OPERATOR`, default `cli:<your login>`) is the id recorded on
  every decision;
- `--tenant` (env `TOOLLEDGER_TENANT`) limits what is seen and decided to one tenant; without it
  `list` shows every tenant and the other commands act on the call's own tenant.

Exit statuses are every command's (`toolledger.cli.entry`): 0 done, 1 refused or not found (the
message says what the call is now), 2 bad input or configuration, 3 the ledger did not answer.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import click
from rich.table import Table

from toolledger.cli import entry
from toolledger.cli.entry import exit_status
from toolledger.events.models import utcnow
from toolledger.events.records import UNSETTLED, CallRecord, CallStatus

if TYPE_CHECKING:
    from toolledger.api.service import Approval, Operator, OperatorService
    from toolledger.settings import OperatorSettings

# The operator service, the stack and FastAPI's app module are imported by the commands that
# run (`_run`, `_as`), not here: `toolledger executions --help` must not load them.

_console = entry.console()
_T = TypeVar("_T")
_STATUSES: tuple[str, ...] = get_args(CallStatus)


def _default_operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


_tenant = click.option(
    "--tenant",
    envvar="TOOLLEDGER_TENANT",
    default=None,
    help="Only this tenant [env TOOLLEDGER_TENANT; default: list every tenant, act on the "
    "call's own tenant].",
)
_operator = click.option(
    "--operator",
    envvar="TOOLLEDGER_OPERATOR",
    default=_default_operator,
    show_default="cli:<your login>",
    help="Operator id recorded on the decision [env TOOLLEDGER_OPERATOR].",
)
_reason = click.option("--reason", required=True, help="What you checked (required, non-empty).")
_expected = click.option(
    "--expected-version",
    type=click.IntRange(min=0),
    default=None,
    help="Refuse unless the call is still at this version (default: its current version).",
)


def _run(
    tools: tuple[str, ...],
    body: Callable[[OperatorService], Coroutine[Any, Any, _T]],
) -> _T:
    """Connect, run `body` on a service, close; turn failures into messages and exit codes."""
    from toolledger.api.closing import close_stack
    from toolledger.api.compensation import RuntimeCompensator, load_tools
    from toolledger.api.errors import Conflict
    from toolledger.api.service import OperatorService
    from toolledger.settings import OperatorSettings, load_settings
    from toolledger.wiring.stack import LedgerStack
    from toolledger.wiring.stack_port import StackPort

    async def main(settings: OperatorSettings) -> _T:
        registry = load_tools(tools) if tools else {}
        stack = await LedgerStack.connect(settings, create_topics=False)
        compensator = None
        try:
            if registry:
                compensator = RuntimeCompensator(
                    StackPort(stack), registry, verdict_timeout=settings.verdict_timeout_s
                )
            service = OperatorService(
                stack.store,
                stack.commands,
                signing_keys=settings.signing_keys,
                verdict_timeout=settings.verdict_timeout_s,
                compensator=compensator,
            )
            return await body(service)
        finally:
            if compensator is not None:
                await compensator.close()
            await close_stack(stack)

    try:
        return asyncio.run(main(load_settings(OperatorSettings)))
    except Conflict as exc:
        # The group prints one line per error; a refusal also says where the call is now.
        click.echo(f"refused ({exc.code}): {exc.message}", err=True)
        if exc.record is not None:
            click.echo(f"now: {_summary(exc.record)}", err=True)
        if exc.resolvable_after is not None:
            click.echo(f"resolvable after {exc.resolvable_after.isoformat()}", err=True)
        raise click.exceptions.Exit(exit_status(exc)) from exc


def _as(tenant: str | None, operator: str) -> Operator:
    """The CLI's operator: an admin, in `tenant` (None: every tenant), recorded as `operator`."""
    from toolledger.api.service import Operator

    return Operator(tenant, operator)


def _summary(record: CallRecord) -> str:
    """One line: the status, and who decided it, in the words of what happened."""
    from toolledger.api.service import resolvable_after

    text = f"{record.key} is {record.status} (version {record.version})"
    op, reason = record.operator, record.reason
    undoing = record.status in ("compensating", "compensated")
    if op is not None and (undoing or _undo_failed(record)):
        # The runtime ran (or tried) the compensation; an operator is who asked for it.
        failed = "" if undoing else " failed"
        text += f", compensation asked for by {op}{failed}: {reason}"
    elif record.status == "approved":
        text += f", approved by {op}: {reason}"
    elif record.settled_by == "operator":
        text += f", settled by operator {op}: {reason}"
    elif record.settled_by is not None:
        text += f", settled by {_SETTLERS[record.settled_by]}"
        if op is not None:
            text += f" after {op} approved it: {reason}"
    if record.contested:
        text += f"; CONTESTED by {record.contested_evidence}: resolve it again"
    after = resolvable_after(record)
    if after is not None:
        text += f"; resolvable after {after.isoformat(timespec='seconds')}"
    return text


#: Statuses in which a call waits for someone (a reconcile hook, an operator, an approver): the
#: only ones whose age since the last change is a waiting time. A settled call waits for no one.
_WAITING: frozenset[str] = UNSETTLED | {"awaiting_approval"}
_SETTLERS = {"runtime": "the runtime", "reconcile": "its reconcile hook", "operator": "an operator"}
#: Statuses whose record's `error` is why the call stands where it is; in any other status the
#: error is from before the call was settled (an operator resolved it completed, say).
_ERROR_IS_CURRENT = frozenset({"failed", "indeterminate"})


def _undo_failed(record: CallRecord) -> bool:
    return record.status == "completed" and (record.error or "").startswith("compensation failed")


def _age(since: datetime) -> str:
    seconds = int((utcnow() - since).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


@click.group()
def executions() -> None:
    """Inspect and settle tool executions: the operator queue (configured by TOOLLEDGER_*)."""


@executions.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    help=f"Only these statuses (repeat or comma-separate): {', '.join(_STATUSES)}.",
)
@click.option("--tool", default=None, help="Only this tool.")
@click.option("--run-id", default=None, help="Only this run.")
@click.option(
    "--contested",
    is_flag=True,
    help="Only contested calls: settled, then contradicted by a late outcome; they wait for "
    "a new `resolve`.",
)
@_tenant
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", default=None, help="Continue after a previous page.")
def list_command(
    statuses: tuple[str, ...],
    tool: str | None,
    run_id: str | None,
    contested: bool,
    tenant: str | None,
    limit: int,
    cursor: str | None,
) -> None:
    """List calls, longest-waiting first."""
    wanted = {s.strip() for group in statuses for s in group.split(",") if s.strip()}
    unknown = sorted(wanted - set(_STATUSES))
    if unknown:
        raise click.BadParameter(
            f"unknown status {', '.join(unknown)}; the statuses are {', '.join(_STATUSES)}",
            param_hint="--status",
        )
    chosen = frozenset(s for s in get_args(CallStatus) if s in wanted)
    page = _run(
        (),
        lambda service: service.list_calls(
            _as(tenant, "cli"),
            statuses=chosen,
            tool=tool,
            run_id=run_id,
            contested=True if contested else None,
            limit=limit,
            cursor=cursor,
        ),
    )
    table = Table(title=f"{len(page.items)} tool executions, longest-waiting first")
    # Keys and tool names are never split over lines (they are copied into the next command);
    # the rest wraps.
    for column in ("key", "tenant", "tool"):
        table.add_column(column, no_wrap=True)
    for column in ("status", "ver", "waiting", "error / reason"):
        table.add_column(column, overflow="fold")
    for r in page.items:
        table.add_row(
            r.key,
            r.tenant_id,
            r.tool,
            f"{r.status} (contested)" if r.contested else r.status,
            str(r.version),
            _age(r.updated_at) if r.status in _WAITING else "-",
            r.reason or (r.error if r.status in _ERROR_IS_CURRENT else None) or "",
        )
    _console.print(table)
    if page.next_cursor is not None:
        _console.print(f"more: --cursor {page.next_cursor}")


@executions.command("show")
@click.argument("key")
@_tenant
def show_command(key: str, tenant: str | None) -> None:
    """Show KEY's record and every event of it, accepted or rejected."""
    record, history = _run((), lambda service: service.show(_as(tenant, "cli"), key))
    _console.print(f"[bold]{_summary(record)}[/bold]")
    _console.print(f"tool {record.tool} ({record.effect}), tenant {record.tenant_id}")
    _console.print(f"arguments {record.arguments_json}")
    if record.result_json is not None:
        _console.print(f"result {record.result_json} (reference {record.result_reference})")
    if record.error is not None and (record.status in _ERROR_IS_CURRENT or _undo_failed(record)):
        _console.print(f"error {record.error}")
    table = Table(title=f"history of {key}")
    for column in ("offset", "occurred at", "event", "actor", "verdict", "ver", "detail"):
        table.add_column(column)
    for h in history:
        verdict = "[green]accepted[/green]" if h.accepted else f"[red]{h.reason}[/red]"
        table.add_row(
            f"{h.partition}/{h.offset}",
            h.occurred_at.isoformat(timespec="milliseconds"),
            h.event_type,
            h.actor,
            verdict,
            "" if h.version is None else str(h.version),
            h.detail,
        )
    _console.print(table)


@executions.command("resolve")
@click.argument("key")
@click.option("--outcome", type=click.Choice(["completed", "failed"]), required=True)
@_reason
@click.option("--value", default=None, help="The result, as JSON (completed only).")
@click.option("--result-reference", default=None, help="The effect's id in the other system.")
@_expected
@_tenant
@_operator
def resolve_command(
    key: str,
    outcome: str,
    reason: str,
    value: str | None,
    result_reference: str | None,
    expected_version: int | None,
    tenant: str | None,
    operator: str,
) -> None:
    """Settle an unknown call KEY as completed or failed, with the reason."""
    try:
        parsed = None if value is None else json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--value") from None
    record = _run(
        (),
        lambda service: service.resolve(
            _as(tenant, operator),
            key,
            outcome="completed" if outcome == "completed" else "failed",
            reason=reason,
            value=parsed,
            result_reference=result_reference,
            expected_version=expected_version,
        ),
    )
    _console.print(f"[green]resolved[/green]: {_summary(record)}")


@executions.command("approve")
@click.argument("key")
@_reason
@_expected
@_tenant
@_operator
def approve_command(
    key: str, reason: str, expected_version: int | None, tenant: str | None, operator: str
) -> None:
    """Let KEY, which awaits approval, run (its run reserves it again)."""
    _approval("approve", key, reason, expected_version, tenant, operator)


@executions.command("reject")
@click.argument("key")
@_reason
@_expected
@_tenant
@_operator
def reject_command(
    key: str, reason: str, expected_version: int | None, tenant: str | None, operator: str
) -> None:
    """Refuse KEY, which awaits approval: it becomes failed, not attempted."""
    _approval("reject", key, reason, expected_version, tenant, operator)


def _approval(
    decision: Approval,
    key: str,
    reason: str,
    expected_version: int | None,
    tenant: str | None,
    operator: str,
) -> None:
    record = _run(
        (),
        lambda service: service.decide_approval(
            decision, _as(tenant, operator), key, reason=reason, expected_version=expected_version
        ),
    )
    done = "approved" if decision == "approve" else "rejected"
    _console.print(f"[green]{done}[/green]: {_summary(record)}")


@executions.command("compensate")
@click.argument("key")
@_reason
@click.option(
    "--tools",
    "tools",
    multiple=True,
    envvar="TOOLLEDGER_TOOLS",
    help="Module declaring the call's toolset, whose compensation runs here (repeatable; "
    "required to run one) [env TOOLLEDGER_TOOLS].",
)
@_tenant
@_operator
def compensate_command(
    key: str, reason: str, tools: tuple[str, ...], tenant: str | None, operator: str
) -> None:
    """Undo the completed call KEY by running its tool's compensation once (KEY:compensate)."""
    done = _run(
        tools, lambda service: service.compensate(_as(tenant, operator), key, reason=reason)
    )
    colour = "green" if done.record.status == "compensated" else "yellow"
    _console.print(f"[{colour}]{done.record.status}[/{colour}]: {_summary(done.record)}")
    if done.compensation is not None:
        _console.print(f"compensation: {_summary(done.compensation)}")
