"""The history hash chain: each entry is linked to the previous entry of its key."""

from __future__ import annotations

import hashlib

from tests import builders as b
from toolledger.events.fold import (
    HistoryEntry,
    LedgerFold,
    Positioned,
    broken_chains,
    chain_hash,
)
from toolledger.events.models import Event


def _fold(*events: Event) -> LedgerFold:
    fold = LedgerFold(keys=b.KEYS)
    for offset, event in enumerate(events, start=1):
        fold.apply(Positioned(partition=0, offset=offset, event=event))
    return fold


def _story() -> list[HistoryEntry]:
    """Two keys interleaved, with a rejected late outcome after a run event of another run."""
    one, two = b.reserved("r1", "c1"), b.reserved("r1", "c2")
    return _fold(
        b.run_started("r0"), one, two, b.completed(one), b.completed(two), b.completed(one)
    ).history


def test_the_chain_hash_covers_exactly_the_documented_bytes() -> None:
    """Third-party auditors recompute chains from this definition, so it is frozen here."""
    first = chain_hash(None, '{"a":1}', True, "accepted")
    assert first == hashlib.sha256(b'{"a":1}\naccepted accepted').hexdigest()
    second = chain_hash(first, "{}", False, "late_outcome")
    assert second == hashlib.sha256(bytes.fromhex(first) + b"{}\nrejected late_outcome").hexdigest()


def test_each_entry_links_to_the_previous_entry_of_its_own_key() -> None:
    history = _story()
    heads: dict[str, str | None] = {}
    for entry in history:
        previous = heads.get(entry.key)
        assert entry.chain_hash == chain_hash(
            previous, entry.event_json, entry.accepted, entry.reason
        )
        heads[entry.key] = entry.chain_hash
    assert [e.accepted for e in history if e.key == "r1:c1"] == [True, True, False]
    assert broken_chains(history) == []


def test_an_altered_entry_breaks_the_chain_at_itself() -> None:
    history = _story()
    late = history[5]
    assert (late.key, late.accepted) == ("r1:c1", False)
    history[5] = late.model_copy(update={"accepted": True})
    assert broken_chains(history) == [
        "history chain of key r1:c1 breaks at partition 0 offset 6 (call_completed): this entry "
        "was altered, or an entry of this key before it was removed or moved"
    ]


def test_a_removed_entry_breaks_the_chain_at_the_next_entry_of_its_key() -> None:
    history = _story()
    del history[1]  # r1:c1 reserved
    broken = broken_chains(history)
    assert len(broken) == 1
    assert "key r1:c1 breaks at partition 0 offset 4" in broken[0]


def test_two_entries_of_a_key_swapped_in_log_order_are_found() -> None:
    history = _story()
    first, second = history[2], history[4]  # r1:c2 reserved and completed
    history[2] = first.model_copy(update={"offset": second.offset})
    history[4] = second.model_copy(update={"offset": first.offset})
    broken = broken_chains(history)
    assert broken and all("key r1:c2" in line for line in broken)
    assert "offset 3" in broken[0]


def test_other_keys_chains_are_untouched_by_a_break() -> None:
    history = _story()
    history[3] = history[3].model_copy(update={"event_json": history[3].event_json + " "})
    assert [line.split(" breaks")[0] for line in broken_chains(history)] == [
        "history chain of key r1:c1"
    ]
