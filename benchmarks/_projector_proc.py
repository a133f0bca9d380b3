"""A projector process for catch-up variants that `toolledger projector` cannot be told to run.

`python -m benchmarks._projector_proc [--partitions 0,2] [--no-facts]`, configured by the same
`TOOLLEDGER_*` variables, wired like `LedgerStack.connect(run_projector=True)` with two changes
a benchmark needs: the partitions it may own (the shipped ownership gives every partition to the
first process that asks, so two processes started together do not share a backlog) and whether
facts are published. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Iterable

from benchmarks._support import ensure_ledger
from toolledger.projections.facts import FactsPublisher
from toolledger.projections.ownership import PostgresPartitionLocks
from toolledger.projections.projector import Projector
from toolledger.settings import ProjectorSettings, load_settings
from toolledger.wiring.stack import LedgerStack


class _OnlyThese(PostgresPartitionLocks):
    """Advisory locks as usual, but never on a partition outside `allowed`."""

    def __init__(self, dsn: str, schema: str, allowed: set[int] | None) -> None:
        super().__init__(dsn, schema)
        self._allowed = allowed

    async def acquire(self, partitions: Iterable[int]) -> set[int]:
        allowed = self._allowed
        return await super().acquire(p for p in partitions if allowed is None or p in allowed)


async def _run(allowed: set[int] | None, facts: bool) -> None:
    settings = load_settings(ProjectorSettings)
    settings.require_verify_keys()
    await ensure_ledger(settings)
    stack = await LedgerStack.connect(settings, listen=False)
    database_url, _ = settings.require_services()
    projector = Projector(
        stack.events,
        stack.store,
        _OnlyThese(database_url, settings.schema_name, allowed),
        dlq=stack.dlq,
        facts=FactsPublisher(stack.facts) if facts else None,
        batch_size=settings.batch_size,
        fetch_wait_ms=settings.fetch_wait_ms,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, projector.stop)
    try:
        await projector.run()
    finally:
        await stack.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._projector_proc")
    parser.add_argument("--partitions", help="comma-separated partitions this process may own")
    parser.add_argument("--no-facts", action="store_true", help="do not publish facts")
    args = parser.parse_args()
    allowed = None if not args.partitions else {int(p) for p in args.partitions.split(",")}
    asyncio.run(_run(allowed, facts=not args.no_facts))


if __name__ == "__main__":
    main()
