"""End offsets the read barrier can trust, on the broker the tests run against.

tansu's ListOffsets "latest" answers the base offset of a partition's last batch, plus one: after
5 single-record produces and a batch of 7 it said 6 where the log ended at 12. A leader appends
its requests as one batch, so a barrier on that end would let a read miss most of a batch its
runtimes were just answered for. `KafkaLog.end_offsets` reads the fetch response's high
watermark instead (`toolledger.events.kafka_ends`); these tests hold it to the log's real end,
and a read to everything a leader batch held.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests import builders as b
from tests.integration.leader_support import all_led, leader_of, leader_settings, runtime_port
from tests.isolated import Isolated, running_stack
from toolledger.events.kafka import KafkaLog
from toolledger.events.log import partition_for
from toolledger.port import CallQuery

#: tansu's ListOffsets is wrong where Apache Kafka's is right: both lanes run these.
pytestmark = pytest.mark.both_brokers


async def test_the_end_after_a_multi_record_batch_is_past_its_last_record(
    isolated: Isolated,
) -> None:
    log = KafkaLog(isolated.kafka_bootstrap, f"{isolated.topic_prefix}ends")
    await log.start()
    try:
        await log.ensure_topic(2)
        partition = partition_for("run", 2)
        for _ in range(5):
            await log.append("run", b"single")
        assert await log.end_offsets([partition]) == {partition: 6}  # the marker, then 5
        batch = await asyncio.gather(*(log.append("run", b"batched") for _ in range(7)))
        last = max(position.offset for position in batch)
        assert last == 12
        assert await log.end_offsets() == {partition: 13, 1 - partition: 1}
        for _ in range(3):  # the next fetch starts where the last one learned the end
            more = await asyncio.gather(*(log.append("run", b"more") for _ in range(50)))
            assert await log.end_offsets([partition]) == {partition: more[-1].offset + 1}
    finally:
        await log.close()


async def test_a_read_right_after_a_leader_batch_sees_the_whole_batch(isolated: Isolated) -> None:
    """Sixteen reservations of one run sent at once are appended by their leader in batches
    and answered from memory. A reader in another stack, asking the moment the last answer
    came, must wait for the end of everything the leader answered (with ListOffsets on tansu
    it waited for the first record of the last batch only) and list all sixteen."""
    settings = leader_settings(isolated)
    run = f"batch-{uuid.uuid4().hex[:8]}"
    reservations = [b.reserved(run, f"c{i}", t=i) for i in range(16)]
    async with running_stack(settings) as stack, runtime_port(stack, settings) as port:
        await all_led(port, settings.partitions)
        answered = await asyncio.gather(*(port.append_and_await(r, 10) for r in reservations))
        assert [v.accepted for v in answered] == [True] * 16
        assert port.stats["leader"] == 16, port.stats
        partition = partition_for(run, settings.partitions)
        answered_to = leader_of(stack).led()[partition]
        async with running_stack(settings, run_projector=False) as reader:
            assert await reader.events.end_offsets([partition]) == {partition: answered_to}
            listed = await reader.reads.list_calls(CallQuery(tenant_id=None, run_id=run))
    assert sorted(c.key for c in listed) == sorted(r.key for r in reservations)
