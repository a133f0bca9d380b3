"""What an operator must see about a running projector: halted partitions and lag.

A halted partition (a record of an unknown schema, an operator event signed with an unknown key
id) stops that partition's fold until someone deploys what is missing. The projector logs one
ERROR line when it halts, and once that line scrolled away nothing said so while every call of
the partition's runs waited. So every process that projects shows the same facts in four
places, all read from here:

- the periodic status line (`status_line`);
- `/readyz` (`problems`: 503 while any partition it projects is halted, with the reason);
- Prometheus gauges, per partition (`PARTITION_HALTED`, `PARTITION_LAG`), refreshed by
  `ProjectorHealth.refresh`;
- beside them, every partition's lease (`toolledger.projections.leases`), read from PostgreSQL
  when asked (`ProjectorHealth.leases`): `/readyz` is 503 while an owner has stopped renewing,
  and `PARTITION_LEASE_AGE` and `PARTITION_LEASE_STALE` say which and since when;
- a banner in the console (`banner`).

Each names the partition, the offset it stopped at and what to deploy: the projector's reason
already says all three (`toolledger.projections.decoding`).

Each halt is also recorded beside the partition's offset in PostgreSQL (`record_halts`, on the
same timer as the lag), so `toolledger status`, in any process, shows it too.

Lag is the log's end offset minus the projector's next offset, per owned partition. End offsets
are read only for this (never for correctness) every `interval` seconds by `ProjectorHealth.run`
and cached, so a scrape or a probe costs no request to Kafka; against the development broker
they can be slightly off (docs/architecture.md, "Services").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from prometheus_client import Gauge

from toolledger.events.log import EventLog, LogError
from toolledger.projections.dberrors import database_errors
from toolledger.projections.leases import PartitionLease
from toolledger.projections.projector import Projector

log = logging.getLogger("toolledger.projector")

PARTITION_HALTED = Gauge(
    "toolledger_projector_partition_halted",
    "1 while this process's projector has halted the partition (an unknown schema or key id: "
    "deploy what its log line names), else 0.",
    ["partition"],
)
PARTITION_LAG = Gauge(
    "toolledger_projector_partition_lag_records",
    "Records of the events topic this process's projector has not folded yet, per owned "
    "partition (the log's end offset minus the projector's next offset).",
    ["partition"],
)

PARTITION_LEASE_AGE = Gauge(
    "toolledger_partition_lease_age_seconds",
    "Seconds since the partition's owner last renewed its lease (PostgreSQL's clock), for "
    "every partition an owner ever renewed, whichever process owns it.",
    ["partition"],
)
PARTITION_LEASE_STALE = Gauge(
    "toolledger_partition_lease_stale",
    "1 while the partition's owner has not renewed its lease for half of it or more (stalled, "
    "frozen or gone; nothing is projected there until another projector takes it), else 0.",
    ["partition"],
)

#: Seconds between two reads of the log's end offsets.
LAG_INTERVAL_S = 5.0


@dataclass(frozen=True)
class Halted:
    """A partition the projector stopped folding, where, and why (with what to deploy)."""

    partition: int
    offset: int
    reason: str


def halted(projector: Projector) -> list[Halted]:
    """The projector's halted partitions, by partition, each at the offset it stopped before."""
    owned = projector.owned
    return [
        Halted(partition, owned.get(partition, -1), reason)
        for partition, reason in sorted(projector.stats.halted.items())
    ]


def problems(projector: Projector) -> list[str]:
    """Why a process running `projector` is not ready: one sentence per halted partition."""
    return [
        f"partition {h.partition} is halted at offset {h.offset}: {h.reason}"
        for h in halted(projector)
    ]


def update_lease_gauges(leases: list[PartitionLease]) -> None:
    """Set the lease gauges from `leases` (read just before: the age is of that moment)."""
    for lease in leases:
        PARTITION_LEASE_AGE.labels(str(lease.partition)).set(round(lease.age_s, 3))
        PARTITION_LEASE_STALE.labels(str(lease.partition)).set(1 if lease.stale else 0)


def lag_checks(health: ProjectorHealth) -> dict[str, str]:
    """The lag per partition as `/readyz` reports it beside its other checks."""
    return {f"lag_partition_{p}": str(n) for p, n in health.lag().items()}


class ProjectorHealth:
    """The lag of one projector's partitions, read every `interval` s, and the gauges."""

    def __init__(
        self, projector: Projector, log: EventLog, interval: float = LAG_INTERVAL_S
    ) -> None:
        self.projector = projector
        self.log = log
        self.interval = interval
        self._ends: dict[int, int] = {}
        self._shown: set[int] = set()
        self._recorded: dict[int, str | None] = {}

    def lag(self) -> dict[int, int]:
        """Records behind the log's end per owned partition (as of the last read; none before)."""
        return {
            partition: max(0, self._ends[partition] - offset)
            for partition, offset in sorted(self.projector.owned.items())
            if partition in self._ends
        }

    async def leases(self) -> list[PartitionLease]:
        """Every partition's lease as PostgreSQL holds it now, the gauges set from it; none
        if PostgreSQL does not answer (the projector reports that itself)."""
        leases: list[PartitionLease] = []
        with contextlib.suppress(*database_errors()):
            leases = await self.projector.store.partition_leases()
        update_lease_gauges(leases)
        return leases

    async def refresh(self) -> None:
        """Read the end offsets once and set the gauges; a broker that does not answer leaves the
        last figures (the projector reports the broker itself)."""
        with contextlib.suppress(LogError, NotImplementedError):
            self._ends = await self.log.end_offsets()
        self.update_gauges()
        await self.record_halts()

    async def record_halts(self) -> None:
        """Write each owned partition's halt (or its absence) where `toolledger status` reads
        it, when it changed; a database that does not answer is tried again next time."""
        stops = {h.partition: h for h in halted(self.projector)}
        owned = set(self.projector.owned) | set(stops)
        for partition in sorted(owned):
            stop = stops.get(partition)
            reason = None if stop is None else stop.reason
            if partition in self._recorded and self._recorded[partition] == reason:
                continue
            offset = -1 if stop is None else stop.offset
            try:
                await self.projector.store.record_halt(partition, offset, reason)
            except database_errors() as exc:
                log.debug("partition %d's halt not recorded yet (%r)", partition, exc)
                continue
            self._recorded[partition] = reason
        self._recorded = {p: r for p, r in self._recorded.items() if p in owned}

    def update_gauges(self) -> None:
        stopped = self.projector.stats.halted
        lag = self.lag()
        shown = set(self.projector.owned) | set(stopped)
        for partition in self._shown - shown:  # released partitions are someone else's now
            PARTITION_HALTED.remove(str(partition))
            with contextlib.suppress(KeyError):
                PARTITION_LAG.remove(str(partition))
        for partition in sorted(shown):
            PARTITION_HALTED.labels(str(partition)).set(1 if partition in stopped else 0)
            if partition in lag:
                PARTITION_LAG.labels(str(partition)).set(lag[partition])
        self._shown = shown

    async def run(self) -> None:
        """`refresh` every `interval` seconds, until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    def status_line(self) -> str:
        """The projector's periodic log line: what it owns and applied, its lag per partition,
        and each halted partition with its offset and what to deploy."""
        projector = self.projector
        stats = projector.stats
        line = (
            f"owns {sorted(projector.owned)}; applied {stats.applied} events in {stats.batches} "
            f"batches; {stats.dead_letters} dead letters; {stats.conflicts} conflicts"
        )
        lag = self.lag()
        if lag:
            line += "; lag " + ", ".join(f"p{p}={n}" for p, n in lag.items())
        for stop in halted(projector):
            line += f"; HALTED partition {stop.partition} at offset {stop.offset}: {stop.reason}"
        return line

    def banner(self) -> list[str]:
        """The console's banner lines: empty while nothing is halted."""
        return problems(self.projector)


async def log_status(health: ProjectorHealth, task: asyncio.Task[None], every: float) -> None:
    """Keep the lag fresh and log `status_line` every `every` seconds (at WARNING while a
    partition is halted) until the projector's `task` ends; then re-raise what ended it."""
    lag = asyncio.create_task(health.run(), name="toolledger-projector-health")
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=every)
            if not task.done():
                level = logging.WARNING if health.projector.stats.halted else logging.INFO
                log.log(level, "%s", health.status_line())
    finally:
        lag.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lag
    task.result()
