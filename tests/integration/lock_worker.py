"""A process that holds partition locks and blocks its event loop with a statement in flight.

`python -m tests.integration.lock_worker <dsn> <schema> <lease_s> <block_s>` takes partitions 0
and 1 under a lease of `lease_s`, prints `holding`, then starts the lock session's next
ownership check (`PartitionLocks.check`) and, once that statement has left, blocks its thread
for `block_s` seconds (`blocking`, `unblocked`). It then prints what the check found (`check
True`: still held; `check False`: lost) and exits. `tests/integration/test_partition_locks.py`
shows the lease end such a session: a hung process's last words must not keep its locks.
"""

from __future__ import annotations

import asyncio
import sys
import time

from toolledger.projections.ownership import PostgresPartitionLocks


async def main(dsn: str, schema: str, lease_s: float, block_s: float) -> None:
    locks = PostgresPartitionLocks(dsn, schema, lease_s=lease_s)
    assert await locks.acquire(range(2)) == {0, 1}
    print("holding", flush=True)
    checking = asyncio.create_task(locks.check())
    await asyncio.sleep(0)  # the check's statement is written to the socket; its answer is not read
    print("blocking", flush=True)
    time.sleep(block_s)  # noqa: ASYNC251 -- the point: the event loop does not turn
    print("unblocked", flush=True)
    print(f"check {await checking}", flush=True)
    await locks.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
