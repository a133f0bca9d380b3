"""Every `toolledger` command maps errors to the same exit statuses, logs the same way, and
says what to fix: the shared entry code (`toolledger.cli.entry`) run through the real CLI."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolledger.api.errors import Conflict, InvalidRequest, NotFound, Unavailable
from toolledger.cli import main
from toolledger.cli.entry import ExitStatus, configure_logging, exit_status, message
from toolledger.devstack import DevStackError
from toolledger.errors import ConfigError, LedgerUnavailable
from toolledger.events.log import LogError, LogIdentityError, TopicMissing

README = Path(__file__).resolve().parents[2] / "README.md"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listened, so nobody else takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("TOOLLEDGER_DATABASE_URL", "TOOLLEDGER_KAFKA_BOOTSTRAP", "TOOLLEDGER_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_one_error_maps_to_one_status_whichever_command_raised_it() -> None:
    """A LogError once exited 4 from the projector and 3 from `history`: one mapping now."""
    assert exit_status(ConfigError("TOOLLEDGER_X")) == ExitStatus.USAGE
    assert exit_status(InvalidRequest("empty_reason", "say why")) == ExitStatus.USAGE
    assert exit_status(NotFound("not_found", "no r1:c1")) == ExitStatus.NO
    assert exit_status(Conflict("version_mismatch", "moved")) == ExitStatus.NO
    assert exit_status(Unavailable("unavailable", "no verdict")) == ExitStatus.UNAVAILABLE
    assert exit_status(LedgerUnavailable("no verdict")) == ExitStatus.UNAVAILABLE
    assert exit_status(LogError("cannot connect")) == ExitStatus.UNAVAILABLE
    assert exit_status(DevStackError("no tansu")) == ExitStatus.UNAVAILABLE
    assert exit_status(ConnectionRefusedError()) == ExitStatus.UNAVAILABLE
    assert exit_status(TopicMissing("no topic")) == ExitStatus.LOG_MISMATCH
    assert exit_status(LogIdentityError("epoch changed")) == ExitStatus.LOG_MISMATCH


def _documented_statuses(text: str) -> dict[int, str]:
    rows = re.findall(r"^\| `?(\d+)`? \| (.+?) \|$", text, flags=re.MULTILINE)
    return {int(status): meaning for status, meaning in rows}


@pytest.mark.parametrize("page", [README, ARCHITECTURE], ids=lambda p: p.name)
def test_the_documented_exit_status_table_lists_every_status(page: Path) -> None:
    """The README and docs/architecture.md table must not drift from the statuses used."""
    documented = _documented_statuses(page.read_text())
    assert sorted(documented) == sorted(int(s) for s in ExitStatus), page


def test_a_missing_setting_exits_2_and_names_it(env: pytest.MonkeyPatch) -> None:
    code, output = _invoke("tokens", "list")
    assert code == ExitStatus.USAGE, output
    assert "toolledger tokens: TOOLLEDGER_DATABASE_URL must be set" in output


def test_a_bad_log_level_stops_every_command_naming_the_variable(env: pytest.MonkeyPatch) -> None:
    env.setenv("TOOLLEDGER_LOG_LEVEL", "chatty")
    code, output = _invoke("tokens", "list")
    assert code == ExitStatus.USAGE, output
    assert "TOOLLEDGER_LOG_LEVEL='chatty' is not a log level" in output


def test_a_database_that_does_not_answer_exits_3(env: pytest.MonkeyPatch, closed_port: int) -> None:
    """A refused connection once ended `history` with a traceback; now it is status 3."""
    env.setenv("TOOLLEDGER_DATABASE_URL", f"postgresql://nobody@127.0.0.1:{closed_port}/x")
    env.setenv("TOOLLEDGER_KAFKA_BOOTSTRAP", f"127.0.0.1:{closed_port}")
    code, output = _invoke("history", "r1:c1")
    assert code == ExitStatus.UNAVAILABLE, output
    assert "toolledger history: a service did not answer" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reconciler", "--tools", "no_such_pkg.tools"], "--tools no_such_pkg.tools"),
        (["resumer", "--app", "no_such_pkg.agents:resume"], "--app no_such_pkg"),
        (["api", "--tools", "no_such_pkg.tools"], "--tools no_such_pkg.tools"),
    ],
    ids=["reconciler", "resumer", "api"],
)
def test_a_module_that_cannot_be_imported_exits_2_saying_it_must_be_importable(
    env: pytest.MonkeyPatch, closed_port: int, args: list[str], says: str
) -> None:
    env.setenv("TOOLLEDGER_DATABASE_URL", f"postgresql://nobody@127.0.0.1:{closed_port}/x")
    env.setenv("TOOLLEDGER_KAFKA_BOOTSTRAP", f"127.0.0.1:{closed_port}")
    code, output = _invoke(*args)
    assert code == ExitStatus.USAGE, output
    assert says in output and "must be importable by this process" in output, output


def test_the_tools_options_say_the_module_must_be_importable() -> None:
    for command in ("reconciler", "api", "resumer"):
        code, output = _invoke(command, "--help")
        assert code == 0
        assert "must be importable" in " ".join(output.split()), command


def test_workers_do_not_log_aiokafkas_subscription_line_on_every_identity_check(
    env: pytest.MonkeyPatch,
) -> None:
    """The projector logged aiokafka's "Updating subscribed topics" every 2 s at INFO."""
    chatty = logging.getLogger("aiokafka.consumer.subscription_state")
    root = logging.getLogger()
    before = (root.level, list(root.handlers), chatty.level)
    try:
        configure_logging(logging.INFO)
        assert root.isEnabledFor(logging.INFO)
        assert not chatty.isEnabledFor(logging.INFO)
        assert chatty.isEnabledFor(logging.WARNING)
    finally:
        root.setLevel(before[0])
        root.handlers[:] = before[1]
        chatty.setLevel(before[2])


def test_a_lost_log_reads_stopped_and_exits_4_as_the_drill_expects() -> None:
    """The broker-reset drill recognises a projector's log-identity stop by status 4 and a
    `stopped: ` line; the shared entry code must keep both."""
    lost = LogIdentityError("partition 0 of toolledger.events has no epoch marker")
    assert exit_status(lost) == ExitStatus.LOG_MISMATCH
    assert int(ExitStatus.LOG_MISMATCH) == 4
    assert message(lost) == f"stopped: {lost}"
