"""Every consumer a `KafkaLog` starts is closed, even when the start is cancelled.

A stack closing cancels its projector's health task, which was then in the middle of starting
the consumer that read end offsets (they are read without one now), or a task starting a
reader's consumer. A consumer dropped there was left to the garbage collector, where aiokafka
warns of it (seen once in CI, failing an unrelated later test).
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
        reader = log.reader()
        reading = asyncio.create_task(reader.assign({0: 0}))
        await starting.wait()  # the consumer exists and its start is under way
        assert not reading.done(), "the start finished before it could be cancelled"
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        # the cancelled start re-raises only once its shielded stop has finished
        assert made[0]._closed, "a consumer whose start was cancelled was left open"
        await reader.close()
    finally:
        await log.close()
