"""A record's partition is Kafka's default partitioner's, whoever works it out.

Runtimes, leaders and the memory log place a run with `partition_for` (murmur2, remembered per
key), and the Kafka producer places each record it sends with `_partition_of`, which asks
`partition_for` instead of running aiokafka's own murmur2 on every send. If either disagreed
with aiokafka's default partitioner, a leader would fold a run's records in one partition
while Kafka appended them to another.
"""

from __future__ import annotations

import random
import string

from aiokafka.partitioner import DefaultPartitioner

from toolledger.events.kafka import _partition_of
from toolledger.events.log import partition_for


def test_the_producers_partitioner_is_aiokafkas_default_for_every_key() -> None:
    rng = random.Random(46)
    default = DefaultPartitioner()
    for _ in range(2000):
        length = rng.randint(1, 40)
        key = "".join(rng.choice(string.printable + "éü✓") for _ in range(length)).encode()
        for count in (1, 2, 3, 4, 7, 12):
            partitions = list(range(count))
            expected = default(key, partitions, partitions)
            assert _partition_of(key, partitions, partitions) == expected, (key, count)
            assert partition_for(key.decode(), count) == expected, (key, count)


def test_a_record_without_a_key_is_placed_as_aiokafka_places_it() -> None:
    assert _partition_of(None, [0], [0]) == 0
