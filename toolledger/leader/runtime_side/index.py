"""Read indexes from the partitions' leaders, for the read barrier of any process.

A leader knows where its memory ends in each partition it leads: every record it answered a
runtime for lies below (it answers once its batch is folded). That is the partition's read
index, as in Raft's ReadIndex, and `READ_INDEX` asks for it (`toolledger.leader.runtime_side.
frames`). The read barrier (`toolledger.projections.barrier`) takes, per partition, the larger
of it and the broker's high watermark (`LeaderEnds`): the watermark covers what other writers
appended (a runtime on the direct path, the API), which the leader may not have fetched yet.

A `READ_INDEX` may also name a key: the leader then answers that key's record from memory as of
the end it gives, when memory vouches for it (with the fast path's provenance rules: folded by
this leader, or read from PostgreSQL at its own last commit). `vouched` hands that to
`FreshReads.get_call`, which takes it when the end is at least the partition's end as the
barrier learned it, so a key's read right after a leader's answer, from any process, needs no
wait for the projection's commit.

An accelerator, never a dependency, like the rest of the fast path: a leader that is not
registered, does not answer within `bound`, or answers anything else gives no index (the
watermark alone is right on every broker the tests run) and no record (the read waits for the
projection). A failed leader is left alone for the directory's `retry_after`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Collection
from typing import Any, Protocol

from toolledger.events.log import partition_for
from toolledger.events.records import CallRecord
from toolledger.leader.runtime_side.connection import LeaderConnection, LeaderDirectory
from toolledger.leader.runtime_side.frames import Kind

log = logging.getLogger("toolledger.leader")


class LogEnds(Protocol):
    """Where the log's partitions end, as the broker says (`EventLog` is one)."""

    async def partition_count(self) -> int: ...

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]: ...


class LeaderIndex:
    """`READ_INDEX` requests to the leaders of `directory`, each bounded by `bound` seconds."""

    def __init__(self, directory: LeaderDirectory, partitions: int, bound: float) -> None:
        self.directory = directory
        self.partitions = partitions
        self.bound = bound

    async def ends(self, partitions: Collection[int]) -> dict[int, int]:
        """The read index of those of `partitions` that have a leader answering now."""
        by_leader: dict[str, tuple[LeaderConnection, list[int]]] = {}
        for partition in partitions:
            connection = await self.directory.connection(partition)
            if connection is not None:
                by_leader.setdefault(connection.address, (connection, []))[1].append(partition)
        answers = await asyncio.gather(
            *(self._ask(c, {"partitions": ps}, ps) for c, ps in by_leader.values())
        )
        ends: dict[int, int] = {}
        for answer in answers:
            if answer is not None:
                ends.update({int(p): int(end) for p, end in answer["ends"].items()})
        return ends

    async def vouched(self, key: str, run_id: str) -> tuple[int, CallRecord | None] | None:
        """(the read index of `run_id`'s partition, `key`'s record as of it: None if it has
        none) when the leader's memory vouches for the key; None when it does not answer so."""
        partition = partition_for(run_id, self.partitions)
        connection = await self.directory.connection(partition)
        if connection is None:
            return None
        asked = {"partitions": [partition], "key": key, "run_id": run_id}
        answer = await self._ask(connection, asked, [partition])
        if answer is None or not answer["known"] or str(partition) not in answer["ends"]:
            return None
        record = answer["record"]
        found = None if record is None else CallRecord.model_validate(record)
        return int(answer["ends"][str(partition)]), found

    async def _ask(
        self, connection: LeaderConnection, asked: dict[str, Any], partitions: list[int]
    ) -> dict[str, Any] | None:
        """The leader's `INDEX` answer, or None (and the leader marked) if it gave none."""
        try:
            body = json.dumps(asked).encode()
            frame = await connection.request(Kind.READ_INDEX, body, self.bound)
        except (TimeoutError, OSError) as exc:
            for partition in partitions:
                self.directory.failed(partition, f"{type(exc).__name__} {exc}".strip())
            return None
        if frame.kind is not Kind.INDEX:
            if frame.kind is Kind.NOT_LEADER:
                for partition in partitions:
                    self.directory.moved(partition)
            return None
        try:
            answer: dict[str, Any] = json.loads(frame.body)
            answer["ends"] = {str(p): int(end) for p, end in answer["ends"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("a leader's INDEX answer is unreadable (%s); ignored", exc)
            return None
        return answer


class LeaderEnds:
    """The read barrier's ends: per partition, the larger of the broker's end and the leader's
    read index (see the module)."""

    def __init__(self, log: LogEnds, index: LeaderIndex) -> None:
        self.log = log
        self.index = index

    async def partition_count(self) -> int:
        return await self.log.partition_count()

    async def end_offsets(self, partitions: Collection[int] | None = None) -> dict[int, int]:
        if partitions is None:
            partitions = range(await self.log.partition_count())
        broker, leaders = await asyncio.gather(
            self.log.end_offsets(partitions), self._leaders(partitions)
        )
        return {p: max(end, leaders.get(p, end)) for p, end in broker.items()}

    async def _leaders(self, partitions: Collection[int]) -> dict[int, int]:
        try:
            return await self.index.ends(partitions)
        except Exception as exc:  # an accelerator: the broker's ends stand alone
            log.debug("no read index from the leaders (%s)", exc)
            return {}
