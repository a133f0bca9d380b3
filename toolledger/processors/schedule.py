"""When the reconciler asks a tool's reconcile hook about an unsettled call: pure functions.

Everything the schedule needs is in the call's durable record, so a reconciler that restarts, or
a second one that takes a partition over, asks at the same times without keeping any state of
its own:

- `status`: only `indeterminate` and `started` calls are reconciled;
- `reconcile_attempts`: how many times a hook already said "unknown" (each such answer is a
  `ReconcileAttempted` the decider counted);
- `updated_at`: when the record last changed, i.e. when the last "unknown" was recorded, or when
  the call became `indeterminate` or `started`;
- `deadline`: when the runtime stops waiting for the tool.

A `started` call may still be running, so it is not asked about before its *lease* ends: by
default its deadline plus `CLOCK_SKEW_GRACE` (after which the decider also accepts a `failed`
finding), or `updated_at + lease` when a lease is configured. An `indeterminate` call is asked at
once. After `n` unknowns the next question waits `backoff * 2**(n-1)`, capped at `max_backoff`,
and after `max_attempts` unknowns the call is left to an operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from toolledger.events.lifecycle import open_until
from toolledger.events.records import UNSETTLED, CallRecord


@dataclass(frozen=True)
class ReconcilePolicy:
    """How patiently one tool's unknown calls are looked up.

    `lease=None` means a `started` call is first asked about after its deadline plus the
    clock-skew grace, the moment from which nothing but its own runtime could still settle it.
    """

    max_attempts: int = 10
    backoff: timedelta = timedelta(seconds=1)
    max_backoff: timedelta = timedelta(minutes=5)
    lease: timedelta | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.backoff < timedelta(0) or self.max_backoff < self.backoff:
            raise ValueError(
                f"backoff ({self.backoff}) must be non-negative and at most max_backoff "
                f"({self.max_backoff})"
            )
        if self.lease is not None and self.lease < timedelta(0):
            raise ValueError(f"lease must not be negative, not {self.lease}")


def backoff(policy: ReconcilePolicy, attempts: int) -> timedelta:
    """How long to wait after the `attempts`-th unknown before asking again (0 before the first)."""
    if attempts <= 0:
        return timedelta(0)
    # In float seconds with a bounded exponent: a timedelta times 2**n overflows for large n.
    seconds = policy.backoff.total_seconds() * 2.0 ** min(attempts - 1, 64)
    return min(timedelta(seconds=min(seconds, 1e9)), policy.max_backoff)


def lease_end(record: CallRecord, policy: ReconcilePolicy) -> datetime:
    """When a `started` call stops being presumed still running."""
    if policy.lease is not None:
        return record.updated_at + policy.lease
    return open_until(record)


def next_attempt_at(record: CallRecord, policy: ReconcilePolicy) -> datetime | None:
    """When the hook should next be asked about `record`; None when it never should (the call
    is not unsettled, or it used up its attempts and waits for an operator)."""
    if record.status not in UNSETTLED or record.reconcile_attempts >= policy.max_attempts:
        return None
    if record.reconcile_attempts == 0:
        return record.updated_at if record.status == "indeterminate" else lease_end(record, policy)
    # An earlier attempt already found the lease over: only the backoff counts now.
    return record.updated_at + backoff(policy, record.reconcile_attempts)


def is_due(record: CallRecord, policy: ReconcilePolicy, now: datetime) -> bool:
    """Whether the hook should be asked about `record` at `now`."""
    at = next_attempt_at(record, policy)
    return at is not None and now >= at


def exhausted(record: CallRecord, policy: ReconcilePolicy) -> bool:
    """Whether an unsettled call used up its attempts: only an operator settles it now."""
    return record.status in UNSETTLED and record.reconcile_attempts >= policy.max_attempts
