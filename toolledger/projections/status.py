"""The projector's periodic status line, for every process that runs a projector.

`toolledger projector` and `toolledger server` both log it every `--status-every` seconds, so
an operator reading either log sees the same words: the partitions the process owns, what it
applied, and the trouble it is in.
"""

from __future__ import annotations

import asyncio
import logging

from toolledger.projections.projector import Projector

log = logging.getLogger("toolledger.projector")


def status_line(projector: Projector) -> str:
    """One line: owned partitions, events, batches, dead letters and conflicts so far."""
    stats = projector.stats
    return (
        f"owns {sorted(projector.owned)}; applied {stats.applied} events in {stats.batches} "
        f"batches; {stats.dead_letters} dead letters; {stats.conflicts} conflicts"
    )


async def log_status(projector: Projector, task: asyncio.Task[None], every: float) -> None:
    """Log `status_line` every `every` seconds until the projector's `task` ends; then
    re-raise what ended it."""
    while not task.done():
        await asyncio.wait({task}, timeout=every)
        if not task.done():
            log.info("%s", status_line(projector))
    task.result()
