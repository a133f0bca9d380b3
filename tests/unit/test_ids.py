"""Event and reservation ids: random version-4 UUIDs, never the same one twice.

`random_uuid` hands out ids from blocks of `os.urandom` bytes. The failures it must not have:
an id that is not a valid version-4 UUID (other code compares, hashes and stores them), two
threads taking the same id, and a forked child going on from its parent's block, which would
give the child's first events the very event_ids of the parent's next ones.
"""

from __future__ import annotations

import os
import threading
import uuid

from toolledger.events.ids import BLOCK_IDS, random_uuid


def test_an_id_is_a_version_4_uuid_equal_to_its_parsed_text() -> None:
    for _ in range(3 * BLOCK_IDS):
        made = random_uuid()
        assert made.version == 4 and made.variant == uuid.RFC_4122
        again = uuid.UUID(str(made))
        assert again == made and hash(again) == hash(made) and again.bytes == made.bytes


def test_threads_never_take_the_same_id() -> None:
    taken: list[list[uuid.UUID]] = [[] for _ in range(8)]

    def take(into: list[uuid.UUID]) -> None:
        for _ in range(5 * BLOCK_IDS):
            into.append(random_uuid())

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for into in taken for i in into]
    assert len(set(every)) == len(every) == 8 * 5 * BLOCK_IDS


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    random_uuid()  # the block is filled: the parent's next ids are decided
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through the pipe)
        os.close(read)
        os.write(write, b"".join(random_uuid().bytes for _ in range(16)))
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.close(read)
    os.waitpid(child, 0)
    childs = {data[i : i + 16] for i in range(0, len(data), 16)}
    parents = {random_uuid().bytes for _ in range(16)}
    assert len(childs) == 16 and not childs & parents
