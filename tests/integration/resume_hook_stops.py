"""A resume hook module that loads when `toolledger server` checks it (`resumer --check`) but
whose resumer then stops on its own with status 3, as one whose database is gone at start
would: what a child role stopping looks like to the server, made deterministic."""

from __future__ import annotations

import sys

from toolledger import RunRecord

if "--check" not in sys.argv:
    raise SystemExit(3)


async def resume(run: RunRecord) -> None:
    """Never called: the real resumer stops while importing this module."""
