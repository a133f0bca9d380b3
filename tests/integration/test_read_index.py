"""A leader's read index and its memory, for the reads of other processes.

`READ_INDEX` asks a partition's leader where its memory ends (every record it answered lies
below) and, for a key, the key's record from that memory. A reader in another process takes
the record when the leader's end reaches the partition's end as the barrier learned it (the
larger of the broker's high watermark and the leader's index), so a key read right after a
leader's answer needs no wait for the commit; and it does not take the leader at its word when
another writer appended past what the leader has folded.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests import builders as b
from tests.integration.leader_support import all_led, leader_of, leader_settings, runtime_port
from tests.isolated import Isolated, running_stack
from tests.verdict_hold import VerdictHold
from toolledger.events.codec import encode
from toolledger.events.fold import Folded
from toolledger.port import CallQuery
from toolledger.projections.barrier import StaleRead

#: Broker-sensitive (tansu's ListOffsets is wrong where Apache Kafka's is right): both lanes.
pytestmark = pytest.mark.both_brokers


async def test_a_key_read_after_a_leaders_answer_comes_from_its_memory_before_any_commit(
    isolated: Isolated,
) -> None:
    """With the projection held, PostgreSQL has nothing of the call the leader answered; a
    key read in another stack must still show it at once, from the leader's memory, and a
    list (which no memory answers) must wait and say it is stale rather than omit it."""
    settings = leader_settings(isolated)
    run = f"ri-{uuid.uuid4().hex[:8]}"
    reserved = b.reserved(run, "c1")
    async with running_stack(settings) as stack, runtime_port(stack, settings) as port:
        await all_led(port, settings.partitions)
        hold = VerdictHold(stack.store)
        hold.hold()
        try:
            answered = await port.append_and_await(reserved, 10)
            assert answered.accepted and port.stats["leader"] == 1
            async with running_stack(settings, run_projector=False) as reader:
                reader.reads.barrier.timeout = 0.5
                record = await reader.reads.get_call(reserved.key)
                assert record is not None and (record.status, record.version) == ("started", 1)
                assert reader.reads.vouched == 1
                assert await reader.store.get_call(reserved.key) is None, "nothing committed"
                with pytest.raises(StaleRead, match="behind"):
                    await reader.reads.list_calls(CallQuery(tenant_id=None, run_id=run))
        finally:
            hold.release()


async def test_a_leader_behind_another_writers_record_is_not_taken_at_its_word(
    isolated: Isolated,
) -> None:
    """An outcome appended straight to Kafka is acknowledged before the leader has folded it
    (here it never does: the leader skips the projector's batches), so the leader's memory
    still says `started`. A key read must see the completion (waiting for the projection),
    never the leader's older record."""
    settings = leader_settings(isolated)
    run = f"ri-{uuid.uuid4().hex[:8]}"
    reserved = b.reserved(run, "c1")
    async with running_stack(settings) as stack, runtime_port(stack, settings) as port:
        await all_led(port, settings.partitions)
        assert (await port.append_and_await(reserved, 10)).accepted

        async def folds_nothing(*_: Any) -> list[Folded]:
            """The projector's batches no longer reach the leader's memory (and, folded by
            nobody there, the projector folds them itself)."""
            return []

        leader_of(stack).folding = folds_nothing  # type: ignore[method-assign,assignment]
        completed = b.completed(reserved)
        await stack.events.append(run, encode(completed), hint=False)
        async with running_stack(settings, run_projector=False) as reader:
            record = await reader.reads.get_call(reserved.key)
            assert record is not None and record.status == "completed", record
            assert reader.reads.vouched == 0
