"""`toolledger mcp serve` refuses to start on bad configuration, naming what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner

from toolledger.cli import main

NO_SERVICES = {k: None for k in os.environ if k.startswith("TOOLLEDGER_")}


def test_serving_without_the_ledger_s_services_names_the_missing_settings() -> None:
    """Without --memory, a server with no Kafka or PostgreSQL settings must not start on a
    ledger that forgets everything: it exits naming the variables to set."""
    result = CliRunner().invoke(
        main,
        ["mcp", "serve", "--tools", "tests.integrations.mcp_tools", "--tenant", "acme"],
        env=NO_SERVICES,
    )
    assert result.exit_code == 2
    assert "TOOLLEDGER_DATABASE_URL and TOOLLEDGER_KAFKA_BOOTSTRAP must be set" in result.output


def test_serving_a_module_that_cannot_be_imported_says_which() -> None:
    result = CliRunner().invoke(
        main,
        ["mcp", "serve", "--tools", "no_such_tools_module", "--tenant", "acme", "--memory"],
        env=NO_SERVICES,
    )
    assert result.exit_code == 2
    assert "--tools no_such_tools_module: cannot import it" in result.output


def test_serving_needs_a_tenant() -> None:
    result = CliRunner().invoke(
        main,
        ["mcp", "serve", "--tools", "tests.integrations.mcp_tools", "--memory"],
        env=NO_SERVICES,
    )
    assert result.exit_code == 2
    assert "--tenant" in result.output


def test_a_plain_install_names_the_mcp_extra_before_any_setting() -> None:
    """`pip install toolledger` then `toolledger mcp serve` complained about the database and
    Kafka settings; setting them would only have led to the next error. The missing `mcp`
    extra is what to fix first."""
    script = (
        "import sys; sys.modules['mcp'] = None\n"
        "from toolledger.cli import main\n"
        "sys.argv = ['toolledger', 'mcp', 'serve', '--tools', 'tests.integrations.mcp_tools',"
        " '--tenant', 'acme']\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'toolledger[mcp]'" in done.stderr
    assert "TOOLLEDGER_DATABASE_URL" not in done.stderr
