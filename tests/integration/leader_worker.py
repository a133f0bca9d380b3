"""A projector process (and so a leader) with one behaviour changed, for the leader's tests.

`python -m tests.integration.leader_worker [never-commits | late-lock-checks | blocks-loop]` runs
a projector on the `TOOLLEDGER_*` environment and prints `leading` once it holds every partition
with the change in force:

- `never-commits` (the default): the store's batch writes (a batch it folds, and a batch
  the leader folded) are replaced by a wait that never ends. The leader folds and answers
  from memory as usual, and the projector is stuck in its first batch's transaction
  forever: the state "answered, projection not committed" that
  `tests/integration/test_leader.py` SIGKILLs it in.
- `late-lock-checks`: once every partition is held, the projector re-checks its advisory locks
  only hourly (`Projector.ownership_interval`, a quarter of a second otherwise). Frozen, taken
  over and resumed, it is a zombie that has not noticed: it goes on fetching and sends its next
  batch, so what stops it is the offset compare-and-set ("another projector took this
  partition over"), not the lock check a real projector would usually reach first.
  `tests/integration/test_leader_zombie.py` makes that window certain this way instead of
  hoping to freeze a projector inside it. The test also gives it a long lease, so it trusts
  its locks on waking (`toolledger.projections.ownership`). This mode logs at INFO.
- `blocks-loop`: the first record of run `BLOCKING_RUN` the projector decodes blocks its event
  loop for `TOOLLEDGER_TEST_BLOCK_S` seconds (a synchronous sleep inside the batch, as a
  pathological record or a synchronous library call would), printing `blocking` before and
  `unblocked` after. `tests/integration/test_owner_lease.py` shows the lease take its
  partitions meanwhile. This mode logs at INFO.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.integration.procs import until
from toolledger.events.models import Event
from toolledger.settings import ProjectorSettings, load_settings
from toolledger.wiring.stack import LedgerStack

#: Seconds between lock checks in `late-lock-checks` once every partition is held.
LATE = 3600.0
#: The run whose first decoded record blocks a `blocks-loop` projector's event loop.
BLOCKING_RUN = "block-the-loop"


def _blocking(decode: Callable[[bytes], Event], seconds: float) -> Callable[[bytes], Event]:
    """`decode`, blocking the thread for `seconds` on the first record of `BLOCKING_RUN`."""
    blocked = False

    def blocking_decode(data: bytes) -> Event:
        nonlocal blocked
        event = decode(data)
        if event.run_id == BLOCKING_RUN and not blocked:
            blocked = True
            print("blocking", flush=True)
            time.sleep(seconds)  # the point: nothing else of this process runs meanwhile
            print("unblocked", flush=True)
        return event

    return blocking_decode


async def main(mode: str) -> None:
    settings = load_settings(ProjectorSettings)
    if mode in ("late-lock-checks", "blocks-loop"):
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
    stack = await LedgerStack.connect(settings, run_projector=True, listen=False)

    async def never_commits(*_args: Any, **_kwargs: Any) -> Any:
        await asyncio.Event().wait()  # the test SIGKILLs this process here

    if mode == "never-commits":
        stack.store.apply_written = never_commits  # type: ignore[method-assign]
        stack.store.apply_folded = never_commits  # type: ignore[method-assign]
    projector = stack.projector
    assert projector is not None
    if mode == "blocks-loop":
        projector.decode = _blocking(projector.decode, float(os.environ["TOOLLEDGER_TEST_BLOCK_S"]))
    await until(
        lambda: len(projector.owned) == settings.partitions or None,
        timeout=30,
        what="every partition owned",
    )
    if mode == "late-lock-checks":
        projector.ownership_interval = LATE
        await until(
            lambda: projector._next_ownership - time.monotonic() > LATE / 2 or None,
            timeout=30,
            what="the next lock check an hour away",
        )
    sys.stdout.write("leading\n")
    await stack.projector_task


if __name__ == "__main__":
    modes = ("never-commits", "late-lock-checks", "blocks-loop")
    chosen = sys.argv[1] if len(sys.argv) > 1 else modes[0]
    if chosen not in modes:
        raise SystemExit(f"usage: python -m tests.integration.leader_worker [{' | '.join(modes)}]")
    asyncio.run(main(chosen))
