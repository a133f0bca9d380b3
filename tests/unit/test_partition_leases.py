"""The owner's lease where no server is needed: its setting, the PostgreSQL it requires, and
what an operator is told about a partition whose owner stopped renewing (issue 45).

The lease itself is PostgreSQL's to enforce and is shown on real processes in
`tests/integration/test_owner_lease.py`; here are the parts a wrong value or a wrong sentence
would break without any server noticing.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from toolledger.cli import main
from toolledger.cli.entry import ExitStatus
from toolledger.errors import ConfigError
from toolledger.projections.lease_session import check_lease_support
from toolledger.projections.leases import PartitionLease, lease_checks, lease_problems
from toolledger.settings import ProjectorSettings, load_settings


@pytest.mark.parametrize("value", ["0", "-3", "0.5", "601", "ten", ""])
def test_a_bad_owner_lease_stops_the_projector_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A lease PostgreSQL cannot enforce sensibly (under a second, over ten minutes, not a
    number) must stop `toolledger projector` with exit 2 and the variable's name, before it
    connects to anything."""
    monkeypatch.setenv("TOOLLEDGER_OWNER_LEASE_S", value)
    result = CliRunner().invoke(main, ["projector"])
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert "TOOLLEDGER_OWNER_LEASE_S" in result.output


def test_the_owner_lease_is_ten_seconds_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLLEDGER_OWNER_LEASE_S", raising=False)
    assert load_settings(ProjectorSettings).owner_lease_s == 10.0
    monkeypatch.setenv("TOOLLEDGER_OWNER_LEASE_S", "2.5")
    assert load_settings(ProjectorSettings).owner_lease_s == 2.5


def test_postgresql_13_is_refused_saying_why_and_what_to_do() -> None:
    """PostgreSQL 13 has no idle_session_timeout: a projector on it would hold its partitions
    while hung, forever, so it must refuse to start, naming the server, the setting and the
    way out, rather than run without the lease."""
    with pytest.raises(ConfigError) as refused:
        check_lease_support(13, "13.16")
    message = str(refused.value)
    for says in ("PostgreSQL 13.16", "TOOLLEDGER_OWNER_LEASE_S", "idle_session_timeout", "14"):
        assert says in message, message
    check_lease_support(14, "14.0")
    check_lease_support(18, "18.1")


def test_a_lease_renewed_lately_is_no_problem() -> None:
    lease = PartitionLease(3, "host-a pid 7", 10.0, 2.4)
    assert not lease.stale and lease.problem() is None
    assert lease_problems([lease]) == []
    assert lease_checks([lease]) == {
        "lease_partition_3": "host-a pid 7, renewed 2.4s ago (lease 10s)"
    }


def test_an_owner_that_missed_two_renewals_is_named_with_how_long_ago_it_renewed() -> None:
    """The operator must learn which partition, whose owner, since when, and that the lease
    will hand it over, while the owner is frozen and nobody has taken the partition yet."""
    lease = PartitionLease(3, "host-a pid 7", 10.0, 6.04)
    assert lease.stale and not lease.expired
    assert lease_problems([lease]) == [
        "partition 3: its owner (host-a pid 7) has not renewed its lease for 6.0s (lease 10s): "
        "it is stalled or frozen, and nothing is projected there; PostgreSQL frees the "
        "partition in 4.0s"
    ]
    assert lease_checks([lease])["lease_partition_3"].startswith("STALE: host-a pid 7, renewed")


def test_a_lease_run_out_that_nobody_took_over_says_to_start_a_projector() -> None:
    lease = PartitionLease(0, "host-a pid 7", 10.0, 42.0)
    assert lease.expired
    assert lease.problem() == (
        "partition 0: no projector has renewed its lease for 42.0s (lease 10s, last owner "
        "host-a pid 7), and none has taken it over: nothing is projected there; start a projector"
    )


def test_a_partition_released_cleanly_is_stale_only_once_nobody_took_it() -> None:
    """A projector that stopped cleanly clears its name from the lease row; the partition is a
    problem only if no other projector takes it within half a lease."""
    assert PartitionLease(1, None, 10.0, 0.3).problem() is None
    problem = PartitionLease(1, None, 10.0, 12.0).problem()
    assert problem == (
        "partition 1 was released 12.0s ago and no projector has taken it: nothing is projected "
        "there; start a projector"
    )
