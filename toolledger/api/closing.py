"""`close_stack`: closing a `LedgerStack`, made sure to finish (it needs no FastAPI, so the
operator CLI and the server use it on any install)."""

from __future__ import annotations

import asyncio

from toolledger.wiring.stack import LedgerStack

__all__ = ["close_stack"]


async def close_stack(stack: LedgerStack) -> None:
    """`stack.close()`, made sure to finish.

    On Python 3.11, `VerdictWaiter._loop` can swallow the cancellation `close()` sends it
    (`asyncio.wait_for` returns the inner result when the wake event is set in the same instant
    the cancel arrives), and `close()` then waits forever. Until that loop uses
    `asyncio.timeout`, the cancel is repeated here until it is heard.
    """
    closing = asyncio.ensure_future(stack.close())
    while not closing.done():
        await asyncio.wait({closing}, timeout=0.5)
        for task in asyncio.all_tasks():
            if task.get_name() == "toolledger-verdict-waiter" and task.cancelling():
                task.cancel()
    closing.result()
