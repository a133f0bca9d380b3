"""How often a reader with nothing to read asks the broker again: idle means idle.

The local broker (tansu) wakes no parked fetch: a fetch that waits for records returns only at
its timeout, even when records arrive meanwhile. So readers fetch with short waits (the
projector's `TOOLLEDGER_FETCH_WAIT_MS`, 5 ms) to keep verdicts fast, and a reader that never
stopped doing so cost its process and the broker a fetch every few milliseconds of every idle
hour (issue 25: an idle stack burned projector 213 + broker 140 ms of CPU per second).

`IdleBackoff` is the rule, kept pure so it is tested on its own: while records flow a reader
fetches at once, again and again; once none came for `idle_after` seconds it waits `first`
seconds before the next fetch, twice as long after each fetch that finds nothing, up to `bound`.
Records, or a hint that some are there (`active`), put it back to fetching at once. The bound is
the worst a record can wait when nobody hints it: every appender of the events topic hints the
projector that owns the partition (`toolledger.projections.hints`), so the bound only matters
for a hint that got lost, and for readers nobody hints (subscribers of the facts topic).
`toolledger.events.kafka_idle` applies the rule to a Kafka consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Seconds without records before a reader starts backing off. Longer than a hint's trip
#: (`toolledger.projections.hints.HINT_QUIET_S` says why it must be).
IDLE_AFTER_S = 0.25
#: The first wait once idle; it doubles after every fetch that finds nothing.
FIRST_WAIT_S = 0.01
#: The longest wait between two fetches of an idle reader (`TOOLLEDGER_IDLE_FETCH_BOUND_MS`).
BOUND_S = 0.5


@dataclass
class IdleBackoff:
    """When a reader fetches next: at once while records flow, backing off to `bound` when idle.

    `bound` 0 never backs off (every fetch at once, as before this existed).
    """

    bound: float = BOUND_S
    idle_after: float = IDLE_AFTER_S
    first: float = FIRST_WAIT_S
    #: Seconds to wait (unless hinted) before the next fetch; 0 while records flow.
    delay: float = 0.0
    _quiet_since: float = field(default=0.0, repr=False)

    def active(self, now: float) -> None:
        """Records came, or a hint says some are there, or reading (re)starts: fetch at once."""
        self.delay = 0.0
        self._quiet_since = now

    def found_nothing(self, now: float) -> None:
        """A fetch came back empty at `now`: back off further, once idle long enough."""
        if self.bound <= 0:
            return
        if self.delay:
            self.delay = min(self.delay * 2, self.bound)
        elif now - self._quiet_since >= self.idle_after:
            self.delay = min(self.first, self.bound)
