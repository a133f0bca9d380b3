"""Where each partition of a Kafka topic ends, right on Apache Kafka and on tansu.

The read barrier (`toolledger.projections.barrier`) waits for the projection to reach the end of
each partition it reads, so the end must cover every acknowledged record. ListOffsets "latest"
does on Apache Kafka, but tansu answers the base offset of the partition's last batch, plus one:
after 5 single-record produces and one batch of 7 it answers 6 where the log ends at 12, and a
leader appends its requests as one batch. A fetch response carries the partition's high
watermark (the offset after the last record every in-sync replica holds, which is what acks=all
acknowledges), and both brokers report that right: tansu answered 12 there, and 62, 112, 162
after three more batches of 50; Apache Kafka 3.9.1 answered 12, as its ListOffsets did
(tests/integration/test_end_offsets.py checks it on both). One way serves both brokers, so no
code asks which broker it talks to.

So an end is read with a fetch that transfers next to nothing. It starts at the last record
this process saw in the partition (one before the last end it learned: a watermark only grows,
so that record is in the log, and Apache Kafka answers a fetch past the end with
OFFSET_OUT_OF_RANGE and no watermark) and asks for one byte, so the broker sends that record's
batch and no more. Starting where there is a record makes tansu answer at once: at the end of the
log it waits out the fetch's `max_wait_time` (2.1 ms a read against 0.38 ms here), and with a
`max_wait_time` of 0 it answers with no partitions at all. The first end of a partition comes
from ListOffsets, a lower bound on both brokers. One fetch per broker asks for all the
partitions it leads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest

from toolledger.events.log import LogError

_NO_ERROR = 0
_OFFSET_OUT_OF_RANGE = 1
#: The fetch's `max_wait_time` (see the module docstring).
_WAIT_MS = 1
#: ListOffsets' timestamp for "the end".
_LATEST = -1

#: Reads the leaders of the topic's partitions from metadata (`True`: read them again).
Leaders = Callable[[bool], Awaitable[dict[int, int]]]


class HighWatermarks:
    """The ends of one topic's partitions, read as high watermarks (see the module)."""

    def __init__(self, topic: str, client: Callable[[], AIOKafkaClient], leaders: Leaders) -> None:
        self.topic = topic
        self._client = client
        self._leaders = leaders
        #: The last end learned per partition: where its next fetch starts.
        self.known: dict[int, int] = {}

    async def read(self, partitions: Collection[int]) -> dict[int, int]:
        """The high watermark of each of `partitions`; `LogError` if the broker cannot say."""
        unknown = [p for p in partitions if p not in self.known]
        if unknown:
            self.known.update(await self._listed(unknown))
        wanted = set(partitions)
        ends: dict[int, int] = {}
        problems: dict[int, str] = {}
        for attempt in range(2):
            problems = await self._fetch(wanted - set(ends), ends, refresh=attempt > 0)
            if not problems:
                break
        if problems:
            listing = ", ".join(f"partition {p}: {why}" for p, why in sorted(problems.items()))
            raise LogError(f"cannot read the end of {self.topic} ({listing})")
        self.known.update(ends)
        return ends

    async def _listed(self, partitions: Collection[int]) -> dict[int, int]:
        """ListOffsets "latest", sent on the log's own client (a consumer takes a bootstrap
        to start, which a reader's first look would wait for)."""
        leaders = await self._leaders(False)
        by_node: dict[int, list[tuple[int, int]]] = {}
        for p in partitions:
            by_node.setdefault(leaders.get(p, -1), []).append((p, _LATEST))
        listed: dict[int, int] = {p: 0 for p, _ in by_node.pop(-1, [])}  # a fetch from 0 is safe
        answers = await self._send(
            {node: OffsetRequest(-1, 0, [(self.topic, asked)]) for node, asked in by_node.items()}
        )
        for answer in answers:
            for _topic, found in answer.topics:
                for data in found:
                    # v1 and later: partition, error_code, timestamp, offset[, leader_epoch]
                    listed[int(data[0])] = int(data[3]) if int(data[1]) == _NO_ERROR else 0
        return listed

    async def _send(self, requests: dict[int, Any]) -> list[Any]:
        client = self._client()
        try:
            return list(
                await asyncio.gather(*(client.send(node, r) for node, r in requests.items()))
            )
        except KafkaError as exc:
            raise LogError(f"cannot read the end of {self.topic}: {exc!r}") from exc

    async def _fetch(
        self, partitions: Collection[int], ends: dict[int, int], *, refresh: bool
    ) -> dict[int, str]:
        """Fetch the watermarks of `partitions` into `ends`; what went wrong where it did."""
        leaders = await self._leaders(refresh)
        by_node: dict[int, list[tuple[int, int, int]]] = {}
        for p in sorted(partitions):
            by_node.setdefault(leaders.get(p, -1), []).append(
                (p, max(self.known.get(p, 0) - 1, 0), 1)
            )
        problems = {p: "no leader" for p, _, _ in by_node.pop(-1, [])}
        answers = await self._send(
            {
                node: FetchRequest(_WAIT_MS, 0, 1, 0, [(self.topic, asked)])
                for node, asked in by_node.items()
            }
        )
        for answer in answers:
            for _topic, found in answer.topics:
                for data in found:
                    partition, code, watermark = int(data[0]), int(data[1]), int(data[2])
                    if code == _NO_ERROR and watermark >= 0:
                        ends[partition] = watermark
                    elif code == _OFFSET_OUT_OF_RANGE:
                        # The log is shorter than this process saw it (the broker lost data,
                        # or the topic was made again): start over from ListOffsets.
                        self.known.update(await self._listed([partition]))
                        problems[partition] = "the log is shorter than it was"
                    else:
                        problems[partition] = for_code(code).__name__
        return problems
