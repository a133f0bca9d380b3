"""What `toolledger server` hands its child roles, and what their exits mean for it."""

from __future__ import annotations

import asyncio
from unittest.mock import Mock

from toolledger.errors import ExitStatus
from toolledger.server.children import Child, child_environment, exit_of


def test_children_that_run_user_code_never_inherit_the_private_key_or_the_scrape_token() -> None:
    """The reconciler and the resumer run the host's hooks: with the server's signing key in
    their environment a hook could sign an operator decision (docs/security.md, "Roles")."""
    env = child_environment(
        {
            "TOOLLEDGER_DATABASE_URL": "postgresql://db/ledger",
            "TOOLLEDGER_KAFKA_BOOTSTRAP": "kafka:9092",
            "TOOLLEDGER_SCHEMA": "ledger",
            "TOOLLEDGER_SIGNING_KEYS": "ops-1:private",
            "TOOLLEDGER_METRICS_TOKEN": "scrape-token-for-tests",
            "TOOLLEDGER_VERIFY_KEYS": "ops-1:public",
            "PATH": "/usr/bin",
        }
    )
    assert env == {
        "TOOLLEDGER_DATABASE_URL": "postgresql://db/ledger",
        "TOOLLEDGER_KAFKA_BOOTSTRAP": "kafka:9092",
        "TOOLLEDGER_SCHEMA": "ledger",
        "PATH": "/usr/bin",
    }


def _child(role: str) -> Child:
    process = Mock(spec=asyncio.subprocess.Process)
    process.pid = 4242
    return Child(role, process)


def test_a_childs_exit_status_passes_through_and_a_quiet_exit_is_still_a_failure() -> None:
    """A resumer that exits 2 (a bad --resume-app) must make the server exit 2; one that ends
    with 0 or is killed while the server runs is a role that stopped: 1, never 0."""
    assert exit_of(_child("resumer"), 2)[1] is ExitStatus.USAGE
    assert exit_of(_child("reconciler"), 4)[1] is ExitStatus.LOG_MISMATCH
    assert exit_of(_child("reconciler"), 0)[1] is ExitStatus.NO
    said, status = exit_of(_child("reconciler"), -9)
    assert status is ExitStatus.NO
    assert said.startswith("the reconciler (pid 4242) was killed by signal 9")
