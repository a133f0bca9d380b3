"""A database URL that cannot be one is a setting to fix (exit 2), a database that does not
answer is an outage (exit 3); neither leaves Kafka clients behind for the garbage collector.

`TOOLLEDGER_DATABASE_URL=notaurl` once exited 3, "a service did not answer ... run the command
again once it is up", and every failed connect printed three `Unclosed AIOKafkaProducer`
lines: the Kafka producers were started before PostgreSQL was asked, and nobody closed them.
"""

from __future__ import annotations

import os
import socket

import pytest

from tests import builders as b
from tests.integration.procs import run_toolledger_async
from tests.isolated import Isolated, child_env
from toolledger.errors import ConfigError
from toolledger.settings import Settings, load_settings


def _env(isolated: Isolated, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    return {
        **env,
        **child_env(isolated.settings(Settings)),
        "TOOLLEDGER_DATABASE_URL": database_url,
        "TOOLLEDGER_SIGNING_KEYS": b.SIGNING_KEY.setting(),
        "PYTHONWARNINGS": "default",  # show ResourceWarnings, as a developer's shell would
    }


@pytest.mark.parametrize(
    "url",
    ["notaurl", "http://db.example/ledger", "postgresql://u@db:notaport/ledger"],
    ids=["no-scheme", "other-scheme", "bad-port"],
)
async def test_a_malformed_database_url_is_a_setting_to_fix(isolated: Isolated, url: str) -> None:
    code, out, err = await run_toolledger_async(_env(isolated, url), "executions", "list")
    assert code == 2, (out, err)
    assert "TOOLLEDGER_DATABASE_URL" in err and "postgresql://" in err
    assert "service did not answer" not in err
    assert "Unclosed" not in err


def test_the_url_is_checked_when_settings_load_without_echoing_it() -> None:
    """A URL holds a password: the message must say what is wrong, not repeat the value."""
    with pytest.raises(ConfigError, match="TOOLLEDGER_DATABASE_URL") as caught:
        load_settings(database_url="postgres:/s3cret@db/ledger")
    assert "s3cret" not in str(caught.value)


async def test_a_database_that_does_not_answer_is_an_outage_and_closes_kafka(
    isolated: Isolated,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    code, out, err = await run_toolledger_async(_env(isolated, url), "executions", "list")
    assert code == 3, (out, err)
    assert "Unclosed" not in err, err
