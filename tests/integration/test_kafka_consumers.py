"""Every consumer a `KafkaLog` starts is closed, even when the start is cancelled.

A stack closing cancels its projector's health task, which may be in the middle of starting
the consumer that reads end offsets. A consumer dropped there was left to the garbage
collector, where aiokafka warns of it (seen once in CI, failing an unrelated later test).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from tests.isolated import Isolated
from toolledger.events.kafka import KafkaLog


async def test_a_consumer_whose_start_is_cancelled_is_closed(isolated: Isolated) -> None:
    log = KafkaLog(isolated.kafka_bootstrap, f"{isolated.topic_prefix}consumers")
    await log.start()
    try:
        await log.ensure_topic(1)
        made: list[AIOKafkaConsumer] = []
        starting = asyncio.Event()
        make = log._consumer

        def recording(**overrides: Any) -> AIOKafkaConsumer:
            made.append(make(**overrides))
            starting.set()
            return made[-1]

        log._consumer = recording  # type: ignore[method-assign]
        reading = asyncio.create_task(log.end_offsets())
        await starting.wait()  # the consumer exists and its start is under way
        assert not reading.done(), "the start finished before it could be cancelled"
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        # the cancelled read re-raises only once its shielded stop has finished
        assert made[0]._closed, "a consumer whose start was cancelled was left open"
        assert log._offsets is None
        # and the next read starts a consumer of its own and keeps it
        assert await log.end_offsets() == {0: 1}  # the topic's epoch marker
        assert len(made) == 2 and not made[1]._closed
    finally:
        await log.close()
    assert made[1]._closed
