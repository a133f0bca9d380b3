"""`VerdictHold`: a projector whose commits wait, for as long as a test holds them.

While held, nothing is decided in PostgreSQL and no verdict comes: what a runtime sees when the
projector is down after Kafka acknowledged its append (`tests/contract/test_pipelined.py`), and
what a reader sees when the projection is behind the answers (`tests/contract/
test_read_barrier.py`, `tests/integration/test_read_index.py`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from toolledger.projections.store import LedgerStore


class VerdictHold:
    """Holds the projector's commits: while held nothing is decided and no verdict comes."""

    def __init__(self, store: LedgerStore) -> None:
        self._open = asyncio.Event()
        self._open.set()
        # Both ways a projector writes a batch: folded there, or as its leader folded it.
        for name in ("apply_written", "apply_folded"):
            write = getattr(store, name)

            async def held(*args: Any, _write: Any = write, **kwargs: Any) -> Any:
                await self._open.wait()
                return await _write(*args, **kwargs)

            setattr(store, name, held)

    @property
    def released(self) -> asyncio.Event:
        """Set while commits go through; setting it releases the held ones."""
        return self._open

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()
