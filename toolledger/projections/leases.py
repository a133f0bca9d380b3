"""Each partition's lease as operators see it: who owns it, and how long since it was renewed.

A projector that stops without dying keeps its partitions until its lease runs out
(`toolledger.projections.ownership`), and until another projector takes them nothing is projected
there and no leader answers for them. An operator must see that where they look, without reading
logs: `/readyz` (503 while a partition's owner has stopped renewing), the metrics (per partition,
seconds since the last renewal and a stale flag, `toolledger.projections.health`) and
`toolledger status`. All of them read `projection_leases` (migration 0011), which only a live
owner's lock session writes; the age is PostgreSQL's clock minus PostgreSQL's clock, so no
process's clock skews it.

An owner renews every quarter of its lease, so a lease not renewed for half of it has missed two
renewals: its owner is stalled, frozen or gone (`stale`). Past the whole lease PostgreSQL ends
the owner's lock session; a partition still shown so has no projector taking it over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolledger.projections.migrations import Conn

#: The share of its lease after which a partition not renewed counts as stale (two renewals
#: missed: `toolledger.projections.ownership.RENEWALS_PER_LEASE`).
STALE_SHARE = 0.5

#: Every partition's lease row, its age in seconds by the server's clock.
LEASES = (
    "SELECT partition, owner, lease_s, "
    "extract(epoch FROM clock_timestamp() - renewed_at)::float8 AS age_s "
    "FROM projection_leases ORDER BY partition"
)


@dataclass(frozen=True)
class PartitionLease:
    """A partition's owner (None: it released the partition cleanly), its lease in seconds,
    and the seconds since it was last renewed."""

    partition: int
    owner: str | None
    lease_s: float
    age_s: float

    @property
    def stale(self) -> bool:
        """Its owner has stopped renewing (or released it and nobody took it)."""
        return self.age_s > STALE_SHARE * self.lease_s

    @property
    def expired(self) -> bool:
        """Not renewed for the whole lease: PostgreSQL ends the owner's lock session by now, or
        a quarter of the lease later at most (any statement on that session restarts its bound,
        and the owner's ownership checks come between recorded renewals)."""
        return self.age_s > self.lease_s

    def summary(self) -> str:
        """One line: who owns it and when it was last renewed, flagged when stale."""
        who = self.owner or "nobody (released)"
        line = f"{who}, renewed {self.age_s:.1f}s ago (lease {self.lease_s:g}s)"
        return f"STALE: {line}" if self.stale else line

    def problem(self) -> str | None:
        """What an operator must know about this partition, or None while it is renewed."""
        if not self.stale:
            return None
        p, age, lease = self.partition, self.age_s, self.lease_s
        if self.owner is None:
            return (
                f"partition {p} was released {age:.1f}s ago and no projector has taken it: "
                "nothing is projected there; start a projector"
            )
        if not self.expired:
            return (
                f"partition {p}: its owner ({self.owner}) has not renewed its lease for "
                f"{age:.1f}s (lease {lease:g}s): it is stalled or frozen, and nothing is "
                f"projected there; PostgreSQL frees the partition in {lease - age:.1f}s"
            )
        return (
            f"partition {p}: no projector has renewed its lease for {age:.1f}s (lease "
            f"{lease:g}s, last owner {self.owner}), and none has taken it over: nothing is "
            "projected there; start a projector"
        )


def lease_problems(leases: Iterable[PartitionLease]) -> list[str]:
    """One sentence per stale partition, for `/readyz`."""
    return [problem for lease in leases if (problem := lease.problem()) is not None]


def lease_checks(leases: Iterable[PartitionLease]) -> dict[str, str]:
    """Each partition's lease as `/readyz` reports it beside its other checks."""
    return {f"lease_partition_{lease.partition}": lease.summary() for lease in leases}


async def read_leases(conn: Conn) -> list[PartitionLease]:
    """Every partition's lease, by partition, from `conn` (its search_path on the ledger's
    schema): what `/readyz`, the metrics and `toolledger status` show."""
    return [
        PartitionLease(int(r["partition"]), r["owner"], float(r["lease_s"]), float(r["age_s"]))
        for r in await conn.fetch(LEASES)
    ]
