"""Barriers: wait until everything appended to a partition so far has been projected.

The projector folds a partition in log order and commits each batch with its offset, so once
the durable verdict of a record appended now exists, every earlier record of that partition is
in PostgreSQL. End offsets cannot promise that on every broker, and on the leader fast path a
runtime hears its verdicts before the projection commits them (docs/architecture.md, "Answers
come before rows"): a process that must judge from PostgreSQL what another one was told
appends a barrier first. The barrier is a `RunStarted` of a run of its own tenant in the same
partition (`sentinel`), appended on the direct path and awaited there; the first one of a run id
is accepted, later ones are rejected as the run exists, and either verdict is a barrier.
"""

from __future__ import annotations

from itertools import count

from toolledger.events.log import partition_for
from toolledger.events.models import RunStarted, utcnow
from toolledger.events.records import Verdict
from toolledger.wiring.commands import LedgerCommands

#: The tenant of barrier runs: never the drill's, so no check counts them.
SENTINEL_TENANT = "drill-sentinel"


def sentinel(prefix: str, partition: int, partitions: int) -> RunStarted:
    """A `RunStarted` of the run `<prefix>-<partition>-<n>` that lands in `partition`."""
    run_id = next(
        f"{prefix}-{partition}-{n}"
        for n in count()
        if partition_for(f"{prefix}-{partition}-{n}", partitions) == partition
    )
    return RunStarted(
        key=run_id, run_id=run_id, tenant_id=SENTINEL_TENANT, occurred_at=utcnow(), agent=prefix
    )


async def barrier(
    commands: LedgerCommands, run_id: str, partitions: int, *, timeout: float
) -> Verdict:
    """Return once every record appended to `run_id`'s partition before this call is projected.

    `LedgerUnavailable` if no verdict came within `timeout` seconds (no projector owns it)."""
    partition = partition_for(run_id, partitions)
    return await commands.append_and_await(
        sentinel("barrier", partition, partitions), timeout=timeout
    )
