"""What `toolledger status` reports about a running deployment, read where each fact lives.

A deployment's state is spread over the services, never held by one process: which projector
owns a partition is a PostgreSQL advisory lock (`toolledger.projections.ownership`), its leader
is the address registered beside the partition's offset, how far the projection got is that
offset, a halt is recorded there by the owner (`LedgerStore.record_halt`, written by the
projector's health loop), how far the log goes is Kafka's end offset, and the paused runs are
rows. So the status is read from PostgreSQL and Kafka directly, by any process with the shared
settings, whether or not a projector answers.

Each partition is a `PartitionStatus` and the whole a `DeploymentStatus`; both are plain values
rendered by the CLI (a table, or `--json`), so a new fact about a partition (a lease, say) is a
field here, a column there, and one more problem in `PartitionStatus.problems`.

End offsets are for display only, as everywhere (docs/architecture.md, "Services"): against the
development broker they can be a little off, so the lag can be too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from toolledger.projections.leases import PartitionLease, read_leases
from toolledger.projections.ownership import lock_class

if TYPE_CHECKING:
    from toolledger.projections.migrations import Conn

#: The paused statuses of a run (`toolledger.runtime.pauses.PAUSED`, with a host's pause).
PAUSED_STATUSES = ("awaiting_reconciliation", "awaiting_approval", "duplicate_intent", "paused")

_OFFSETS = "SELECT partition, next_offset, leader_address, halted FROM projection_offsets"
# Who holds each partition's lock (`PostgresPartitionLocks`: class, partition; objsubid 2 is
# the two-int4 form), with the application name carrying the projector process's own pid.
_OWNERS = (
    "SELECT l.objid::int AS partition, a.pid AS backend, a.application_name, "
    "host(a.client_addr) AS client FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    "AND l.classid = $1::int8::oid AND l.database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())"
)
_PAUSED = (
    "SELECT status, count(*) AS n, count(*) FILTER (WHERE resume_error IS NOT NULL) AS failed "
    "FROM runs WHERE status = ANY($1::text[]) GROUP BY status"
)


@dataclass(frozen=True)
class PartitionStatus:
    """One partition of the events topic as the deployment has it now."""

    partition: int
    #: The projection's next offset (None: no projector ever took the partition).
    next_offset: int | None
    #: The log's end offset (None: Kafka did not say).
    end_offset: int | None
    #: The projector process holding the partition's lock (None: nobody does).
    owner: str | None
    #: The leader address its owner registered for runtimes (None: no fast path).
    leader: str | None
    #: Why its owner stopped folding it, and what to deploy (None: not halted).
    halted: str | None
    #: Its owner's lease: who renewed it and how long ago (None: no owner ever recorded one).
    lease: PartitionLease | None = None

    @property
    def lag(self) -> int | None:
        """Records of the log not projected yet (for display: end offsets can be off)."""
        if self.end_offset is None or self.next_offset is None:
            return None
        return max(0, self.end_offset - self.next_offset)

    @property
    def problems(self) -> list[str]:
        """What an operator must act on, one sentence each (empty: nothing)."""
        found = []
        lease_problem = None if self.lease is None else self.lease.problem()
        if lease_problem is not None:
            found.append(lease_problem)
        elif self.owner is None:
            found.append(f"partition {self.partition} has no projector: start one")
        if self.halted is not None:
            found.append(f"partition {self.partition} is halted: {self.halted}")
        return found


@dataclass(frozen=True)
class DeploymentStatus:
    """The partitions and the paused runs of one ledger (schema and topics)."""

    schema: str
    topic: str
    partitions: list[PartitionStatus]
    #: Paused runs by status (only statuses with runs).
    paused_runs: dict[str, int] = field(default_factory=dict)
    #: Paused runs whose resume hook failed every try (`RunRecord.resume_error`).
    not_resumed: int = 0

    @property
    def problems(self) -> list[str]:
        found = [p for partition in self.partitions for p in partition.problems]
        if self.not_resumed:
            found.append(
                f"{self.not_resumed} paused run(s) not resumed: their resume hook failed every "
                "try (GET /v1/runs?resume_failed=true)"
            )
        return found

    def as_json(self) -> dict[str, Any]:
        """The status as JSON values, each partition with its lag and problems."""
        shown = asdict(self)
        for row, partition in zip(shown["partitions"], self.partitions, strict=True):
            row["lag"] = partition.lag
            if partition.lease is not None:
                row["lease"]["stale"] = partition.lease.stale
            row["problems"] = partition.problems
        shown["problems"] = self.problems
        return shown


def owner_name(application_name: str, backend: int, client: str | None) -> str:
    """How the status names a lock holder: the projector's own pid where its session says it
    (`toolledger-locks-<pid>`), and the host it connects from."""
    prefix = "toolledger-locks-"
    who = (
        f"pid {application_name.removeprefix(prefix)}"
        if application_name.startswith(prefix)
        else f"backend {backend}"
    )
    return f"{who} at {client}" if client else f"{who} (local socket)"


async def read_status(
    conn: Conn, schema: str, topic: str, count: int, end_offsets: Mapping[int, int] | None
) -> DeploymentStatus:
    """The deployment's status from `conn` (search_path on `schema`) and the log's `count`
    partitions and end offsets (None: Kafka did not answer them)."""
    rows = {int(r["partition"]): r for r in await conn.fetch(_OFFSETS)}
    owners = {
        int(r["partition"]): owner_name(str(r["application_name"]), r["backend"], r["client"])
        for r in await conn.fetch(_OWNERS, lock_class(schema))
    }
    leases = {lease.partition: lease for lease in await read_leases(conn)}
    ends = end_offsets or {}
    partitions = [
        PartitionStatus(
            partition=p,
            next_offset=None if p not in rows else int(rows[p]["next_offset"]),
            end_offset=ends.get(p),
            owner=owners.get(p),
            leader=None if p not in rows else rows[p]["leader_address"],
            halted=None if p not in rows else rows[p]["halted"],
            lease=leases.get(p),
        )
        for p in range(count)
    ]
    paused = await conn.fetch(_PAUSED, list(PAUSED_STATUSES))
    return DeploymentStatus(
        schema=schema,
        topic=topic,
        partitions=partitions,
        paused_runs={r["status"]: int(r["n"]) for r in paused},
        not_resumed=sum(int(r["failed"]) for r in paused),
    )
