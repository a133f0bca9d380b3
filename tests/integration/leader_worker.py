"""A projector process whose projection never commits: its leader answers, nothing is written.

`python -m tests.integration.leader_worker` runs a projector (and so a leader) on the
`TOOLLEDGER_*` environment, with the store's batch write replaced by a wait that never ends.
The leader folds and answers from memory as usual, and the projector is stuck in its first
batch's transaction forever: the state "answered, projection not committed" that
`tests/integration/test_leader.py` SIGKILLs it in. It prints `leading` once it holds every
partition.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from tests.integration.procs import until
from toolledger.settings import ProjectorSettings, load_settings
from toolledger.wiring.stack import LedgerStack


async def main() -> None:
    settings = load_settings(ProjectorSettings)
    stack = await LedgerStack.connect(settings, run_projector=True, listen=False)

    async def never_commits(*_args: Any, **_kwargs: Any) -> Any:
        await asyncio.Event().wait()  # the test SIGKILLs this process here

    stack.store.apply_written = never_commits  # type: ignore[method-assign]
    projector = stack.projector
    assert projector is not None
    await until(
        lambda: len(projector.owned) == settings.partitions or None,
        timeout=30,
        what="every partition owned",
    )
    sys.stdout.write("leading\n")
    await stack.projector_task


if __name__ == "__main__":
    asyncio.run(main())
