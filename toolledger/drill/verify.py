"""The live ledger against a re-fold of the log: what `toolledger replay --verify` does.

The log is folded from offset 1 into a fresh, empty schema up to the live ledger's stored
offsets (the replay's targets), with the projector's own decode and apply code, and the two
ledgers are compared record by record, history row by history row, and by digest; the
re-fold's verdicts of the event_ids the runtimes heard are read back for `checks`. The drill
calls it once nothing appends any more and the projectors are stopped, so the targets are
exactly what the live ledger folded.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from toolledger.drill.checks import Refold
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.drill.verdicts import verdict_form
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import compare, replay
from toolledger.wiring.stack import LedgerStack


async def refold_log(
    stack: LedgerStack,
    db: LedgerDB,
    live_digest: str,
    fresh: PostgresLedger,
    heard: Collection[str] = (),
) -> Refold:
    """Re-fold the log into `fresh` (an empty schema) and compare it with the live ledger;
    with the re-fold's verdicts of the event_ids in `heard`."""
    rows = await db.fetch("SELECT partition, next_offset FROM projection_offsets")
    targets = {int(r["partition"]): int(r["next_offset"]) for r in rows}
    await fresh.start()
    try:
        replayed = await replay(stack.events, fresh, targets=targets)
        snapshot = await fresh.snapshot()
        verdicts = await fresh.verdicts(sorted({uuid.UUID(e) for e in heard}))
    finally:
        await fresh.close()
    live = await stack.store.snapshot()
    moved = [] if live.digest() == live_digest else ["the live ledger moved during the check"]
    return Refold(
        live_digest=live_digest,
        replay_digest=replayed.replay_digest,
        events=replayed.events,
        differences=compare(live, snapshot) + moved,
        verdicts={str(e): verdict_form(v) for e, v in verdicts.items()},
    )
