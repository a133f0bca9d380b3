"""What every `toolledger` command does the same way: logging, exit statuses, faust workers.

Each was once written per command, and they drifted (a `LogError` exited 4 from the projector
and 3 from `history`). Now a command only raises: the group (`toolledger.cli.main`) turns any
error it lets escape into one line on stderr and the exit status `exit_status` maps it to, so
a script can tell "the answer is no" from "fix your settings" from "try again later":

- **0** done;
- **1** the command ran and the answer is no: refused, not found, a replay that differs, a drill
  check violated, a worker that crashed;
- **2** the command cannot run as given: a bad option, `TOOLLEDGER_*` setting, or `--tools` /
  `--app` module;
- **3** a service did not answer (Kafka, PostgreSQL, the projector): nothing was decided; run
  it again once the service is up;
- **4** the log is not what the ledger expects: a topic is missing (start `toolledger projector`
  once, it creates them) or is not the one the ledger was built from;
- **143** a command with an end (`toolledger drill`) stopped by SIGTERM or SIGINT before it
  finished; services (projector, reconciler, API...) exit 0 when stopped.

The same table is in the README and docs/architecture.md ("Exit statuses").
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING

from rich.console import Console

from toolledger.errors import ExitStatus, ToolLedgerError

if TYPE_CHECKING:
    import faust

if TYPE_CHECKING:
    import faust

LOG_LEVEL_ENV = "TOOLLEDGER_LOG_LEVEL"
__all__ = [
    "CommandFailed",
    "ExitStatus",
    "configure_logging",
    "console",
    "exit_status",
    "handled",
    "message",
    "run_worker",
]

#: Line width when output is not a terminal: no table of ours comes near it.
_PIPE_WIDTH = 2000
_LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
#: Library loggers whose INFO lines repeat on a timer and say nothing to an operator: aiokafka
#: logs "Updating subscribed topics" each time a consumer is assigned, which the projector's
#: identity check does every `TOOLLEDGER_IDENTITY_CHECK_S`.
_CHATTY = ("aiokafka.consumer.subscription_state",)
#: faust's, mode's and aiokafka's group loggers: about seventy INFO lines at every start of a
#: faust worker (each service "Starting...", each table recovered, each step of the group join)
#: that buried the worker's own lines, which say what it owns. Shown at DEBUG, else from WARNING.
_START_UP = ("faust", "mode", "aiokafka.consumer.group_coordinator", "aiokafka.consumer.consumer")


class CommandFailed(ToolLedgerError):
    """A problem a command phrased itself for the operator, with the exit status it means."""

    code = "command_failed"

    def __init__(self, message: str, status: ExitStatus) -> None:
        super().__init__(message)
        self.status = status


_StatusTable = tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ExitStatus], ...]


@functools.cache
def _statuses() -> _StatusTable:
    """Most specific first: the first class an error is an instance of decides its status.

    Built on the first error, not at import: the classes live beside aiokafka, asyncpg and
    FastAPI, which `toolledger --help` must not import.
    """
    from aiokafka.errors import KafkaError

    from toolledger.api.errors import Conflict, InvalidRequest, Misconfigured, NotFound, Unavailable
    from toolledger.devstack import DevStackError, DevStackMissing
    from toolledger.errors import ConfigError, LedgerUnavailable
    from toolledger.events.log import LogError, LogIdentityError, TopicMissing
    from toolledger.events.signing import KeySetMismatch
    from toolledger.projections.dberrors import DATABASE_ERRORS
    from toolledger.runtime.agents import AgentConfigError

    return (
        (ConfigError, ExitStatus.USAGE),
        (AgentConfigError, ExitStatus.USAGE),
        (InvalidRequest, ExitStatus.USAGE),
        (Misconfigured, ExitStatus.USAGE),
        (KeySetMismatch, ExitStatus.USAGE),
        (DevStackMissing, ExitStatus.USAGE),
        (NotFound, ExitStatus.NO),
        (Conflict, ExitStatus.NO),
        (Unavailable, ExitStatus.UNAVAILABLE),
        (LedgerUnavailable, ExitStatus.UNAVAILABLE),
        (TopicMissing, ExitStatus.LOG_MISMATCH),
        (LogIdentityError, ExitStatus.LOG_MISMATCH),
        (LogError, ExitStatus.UNAVAILABLE),
        (DevStackError, ExitStatus.UNAVAILABLE),
        (KafkaError, ExitStatus.UNAVAILABLE),
        (DATABASE_ERRORS, ExitStatus.UNAVAILABLE),
    )


def exit_status(exc: BaseException) -> ExitStatus:
    """The one mapping from an error to the exit status of the command it stopped."""
    if isinstance(exc, CommandFailed):
        return exc.status
    for kind, status in _statuses():
        if isinstance(exc, kind):
            return status
    return ExitStatus.NO


def handled(exc: BaseException) -> bool:
    """Whether the group reports `exc` as a message (else it is a bug: keep its traceback)."""
    if isinstance(exc, ToolLedgerError):
        return True
    from aiokafka.errors import KafkaError

    from toolledger.projections.dberrors import DATABASE_ERRORS

    return isinstance(exc, (KafkaError, *DATABASE_ERRORS))


def message(exc: BaseException) -> str:
    """The line an operator reads: toolledger's own errors are already phrased for people."""
    from toolledger.api.errors import NotFound
    from toolledger.events.log import LogIdentityError

    if isinstance(exc, NotFound):
        return f"not found: {exc.message}; list them with `toolledger executions list`"
    if isinstance(exc, LogIdentityError):
        return f"stopped: {exc}"
    if isinstance(exc, ToolLedgerError):
        return str(exc)
    return f"a service did not answer ({exc!r}); run the command again once it is up"


def configure_logging(default: int | None = None) -> None:
    """Log to stderr at `TOOLLEDGER_LOG_LEVEL`, else at `default` (None: leave logging alone).

    Called by the group for every command and again by long-running ones with their default
    (INFO for workers), so the variable always wins and the format is the same everywhere.
    """
    name = os.environ.get(LOG_LEVEL_ENV, "").strip()
    level: int | None = default
    if name:
        chosen = logging.getLevelName(name.upper())
        if not isinstance(chosen, int):
            from toolledger.errors import ConfigError

            raise ConfigError(
                f"{LOG_LEVEL_ENV}={name!r} is not a log level: use DEBUG, INFO, WARNING or ERROR"
            )
        level = chosen
    if level is None:
        return
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    for chatty in _CHATTY:
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
    for name in _START_UP:
        logging.getLogger(name).setLevel(
            level if level <= logging.DEBUG else max(level, logging.WARNING)
        )


def console(pipe_width: int = _PIPE_WIDTH) -> Console:
    """Rich output for people; cut to the terminal's width only when there is a terminal.

    Written to a pipe, a file or a test, rich would fold every table into 80 columns and
    shorten ids and tool names with an ellipsis, so the token id `tokens revoke` needs could
    not be read from `tokens list | cat`. Without a terminal (and without `COLUMNS`) lines are
    as long as their content (up to `pipe_width`: output with rules, like the demo's, asks for
    a width a rule can be drawn at).
    """
    shown = Console()
    if shown.is_terminal or os.environ.get("COLUMNS"):
        return shown
    return Console(width=pipe_width)


async def run_worker(app: faust.App) -> None:
    """Run a faust app in this process until SIGTERM or SIGINT (the worker handles both).

    toolledger configures logging itself, so faust must not; its spinner would write terminal
    escape codes into the log.
    """
    import faust  # only the processors' commands run one (it is the server extra's)

    worker = faust.Worker(app, quiet=True, redirect_stdouts=False, override_logging=False)
    worker.spinner = None
    await worker.start()
    if worker.crash_reason is not None:
        raise CommandFailed(f"stopped after a crash: {worker.crash_reason!r}", ExitStatus.NO)
