"""Random event and reservation ids (UUID version 4), made cheaply.

Every event a runtime builds gets a fresh `event_id`, and every reservation a
`reservation_id`: two or three per call. `uuid.uuid4()` asks the kernel for 16 random bytes
each time (a syscall) and builds the `UUID` through its validating constructor, about 2.4 us
a time here (BENCHMARKS.md, issue 46). `random_uuid` takes the bytes from `os.urandom` in
blocks of 4 KiB instead, sets the version and variant bits exactly as `uuid4` does, and makes
the `UUID` without running its constructor: the same kind of id, from the same source of
randomness, in a fraction of the time.

Two things must never hand out the same bytes twice: threads (each id is taken from the block
in one step of the interpreter) and a forked child, which would otherwise go on from its
parent's block (`os.register_at_fork` throws the block away in the child).
"""

from __future__ import annotations

import os
import uuid

#: Ids per block read from `os.urandom`.
BLOCK_IDS = 256

_VERSION_4 = 4 << 76
_VARIANT_RFC_4122 = 0x8000 << 48
_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown
#: The next ids' 128-bit values, version and variant set. `list.pop` and `list.extend` of a
#: list are each one step for the interpreter, so threads never take the same value.
_ready: list[int] = []


def random_uuid() -> uuid.UUID:
    """A random (version 4) UUID, as `uuid.uuid4()` makes it."""
    while True:
        try:
            value = _ready.pop()
            break
        except IndexError:
            _refill()
    made = _new(uuid.UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _UNKNOWN)
    return made


def _refill() -> None:
    block = os.urandom(16 * BLOCK_IDS)
    bits = _VERSION_4 | _VARIANT_RFC_4122
    _ready.extend(
        [
            (int.from_bytes(block[at : at + 16], "big") & _KEEP) | bits
            for at in range(0, len(block), 16)
        ]
    )


os.register_at_fork(after_in_child=_ready.clear)
