"""Declared side effects, and the retry rule each one implies.

A tool says what it does to the world (`read()`, `write()`, `external()`, `destructive()`) and
the runtime derives how often it may run from that declaration alone, because a generic retry
policy cannot tell a refund from a search (guarantees 3 and 4 in docs/architecture.md):

- `read()`: up to 3 attempts with exponential backoff and full jitter. Repeating a read costs
  time, never an effect, so a read that times out is simply tried again.
- `write()`, `external()`, `destructive()`: exactly one attempt. A timeout after the request may
  have left is an unknown (`indeterminate`), never a reason to send it again.

`external(pipelined=True)` (and `destructive(approval=False, pipelined=True)`) opts a tool into
pipelined reservation (`toolledger.runtime.pipelined`): its reservation is acknowledged by Kafka
before the tool runs, as always, but its verdict is awaited while the tool runs instead of
before. A duplicate request is then possible (two callers racing on one key both reach the
other system), so the one-effect guarantee rests on that system honouring
`context.idempotency_key`; hence the opt-in, and the refusals at declaration: here, a pipelined
tool that needs an approval (the approval must come before anything is sent) or is not an
`external` or `destructive` effect; in `Tool`, one whose source does not pass the key.

`external(replays_key_for=timedelta(hours=24))` says the other system replays its first answer
for a repeated `context.idempotency_key` within that window (Stripe keeps keys 24 hours). For
such a tool an unknown call is settled by resending the same request with the same key inside
the window, which for that system *is* a lookup (`toolledger.runtime.resend`); past it, or for a
tool that does not declare it, the call is an operator's. Never with `approval`: a resend would
act on an approval given for the first send, and the window would start before the approval.

`SideEffect` is a plain value so it can be inspected (the approval flag travels in the
`reserved` event; `toolledger.testing.assert_tool_contract` reads `attempts`). It can be built by
hand with `attempts > 1` for a write, so that such a declaration is representable and caught by
the contract check in CI; the executor still never makes more than one attempt of a write.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from toolledger.errors import ToolLedgerError

EffectKind = Literal["read", "write", "external", "destructive"]

#: Attempts a read gets: the first and two retries.
READ_ATTEMPTS = 3
#: The first retry's backoff ceiling in seconds; each later retry doubles it.
READ_BACKOFF_S = 0.1
#: The effects a tool may pipeline: the ones whose other system can dedupe a repeated key.
PIPELINABLE: tuple[EffectKind, ...] = ("external", "destructive")


class PipeliningRefused(ToolLedgerError, ValueError):
    """A tool declared `pipelined=True` that cannot be pipelined; the reason says why."""

    code = "pipelining_refused"


@dataclass(frozen=True)
class SideEffect:
    """What a tool does to the world, whether it needs approval, and how often it may run."""

    kind: EffectKind
    approval: bool = False
    attempts: int = 1
    backoff: float = READ_BACKOFF_S
    #: The reservation's verdict is awaited while the tool runs (see the module docstring).
    pipelined: bool = False
    #: The other system replays the first answer for a repeated key for this long: an unknown
    #: call is settled by resending it with the same key within it (see the module docstring).
    replays_key_for: timedelta | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"a {self.kind} tool needs at least one attempt, not {self.attempts}")
        if self.backoff < 0:
            raise ValueError(f"backoff must not be negative, not {self.backoff}")
        if self.pipelined and self.kind not in PIPELINABLE:
            raise PipeliningRefused(
                f"a {self.kind}() tool cannot be pipelined: only external() and destructive() "
                "tools can, whose other system dedupes a repeated idempotency key"
            )
        if self.pipelined and self.approval:
            raise PipeliningRefused(
                f"an approval-gated {self.kind}() tool cannot be pipelined: a pipelined tool "
                "starts before its reservation's verdict, and an approval must come before "
                "anything is sent. Declare it without pipelined=True, or without approval"
            )
        if self.replays_key_for is not None:
            self._check_replay_window(self.replays_key_for)

    def _check_replay_window(self, window: timedelta) -> None:
        if self.kind != "external":
            raise ValueError(
                f"a {self.kind}() tool cannot declare replays_key_for: only external() tools "
                "name a downstream that replays its first answer for a repeated key"
            )
        if self.approval:
            raise ValueError(
                "an approval-gated external() tool cannot declare replays_key_for: its unknown "
                "calls are settled by an operator, never by resending a request that was "
                "approved once. Declare it without approval, or without replays_key_for"
            )
        if window <= timedelta(0):
            raise ValueError(f"replays_key_for must be a positive timedelta, not {window}")

    @property
    def changes_something(self) -> bool:
        """True for every effect but a read: the ones that get one attempt and can be unknown."""
        return self.kind != "read"

    @property
    def max_attempts(self) -> int:
        """Attempts the executor makes: the declared ones for a read, one for anything else."""
        return self.attempts if not self.changes_something else 1

    def backoff_before(self, attempt: int) -> float:
        """Seconds to wait before `attempt` (2, 3, ...): full jitter under an exponential cap.

        Full jitter (uniform in [0, cap]) spreads retries of many runs hitting one flaky service
        instead of synchronising them.
        """
        cap = self.backoff * 2.0 ** max(attempt - 2, 0)
        return random.uniform(0, cap)

    def worst_case_backoff(self) -> float:
        """The longest all retries can sleep; part of the reservation's deadline."""
        return sum(self.backoff * 2.0 ** (n - 2) for n in range(2, self.max_attempts + 1))


def read(*, attempts: int = READ_ATTEMPTS, backoff: float = READ_BACKOFF_S) -> SideEffect:
    """The tool only looks something up: retried up to `attempts` times (at most 3)."""
    if not 1 <= attempts <= READ_ATTEMPTS:
        raise ValueError(f"a read gets 1 to {READ_ATTEMPTS} attempts, not {attempts}")
    return SideEffect("read", attempts=attempts, backoff=backoff)


def write() -> SideEffect:
    """The tool changes state in a system you own (an account owner, a record): one attempt."""
    return SideEffect("write")


def external(
    *,
    approval: bool = False,
    pipelined: bool = False,
    replays_key_for: timedelta | None = None,
) -> SideEffect:
    """The tool acts on the outside world (an email, a credit): one attempt.

    `pipelined=True`: the tool starts as soon as Kafka acknowledged its reservation, while the
    verdict is awaited; only for a tool that passes `context.idempotency_key` to a system that
    honours it, never with `approval` (`PipeliningRefused` otherwise).

    `replays_key_for=timedelta(hours=24)`: the other system replays its first answer for a
    repeated key for that long, so an unknown call is settled by resending it with the same key
    within the window (`toolledger.runtime.resend`); never with `approval`.
    """
    return SideEffect(
        "external", approval=approval, pipelined=pipelined, replays_key_for=replays_key_for
    )


def destructive(*, approval: bool = True, pipelined: bool = False) -> SideEffect:
    """The tool deletes or irreversibly changes something: one attempt, approval by default.

    `pipelined=True` needs `approval=False` (see `external`).
    """
    return SideEffect("destructive", approval=approval, pipelined=pipelined)
