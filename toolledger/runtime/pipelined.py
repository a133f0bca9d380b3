"""Pipelined reservation: the call written down before the tool runs, its verdict awaited while
it runs. A reservation mode of the one call pipeline (`toolledger.runtime.pipeline`); this
module holds its rules: when a call may pipeline (`RunBindings`), and what a reservation
refused after its tool ran answers (`refused`).

A verdict-first call pays a whole round trip before its tool may
start: the reservation appended, fetched by the projector, decided, committed in PostgreSQL and
announced back. A tool declared `external(pipelined=True)` (or `destructive(approval=False,
pipelined=True)`) starts as soon as Kafka has acknowledged its reservation (acks=all: durable,
so the call is still always written down before anything is sent) and the verdict is awaited
while the tool runs:

1. the fast path (`CallPipeline.call`, as for every call) has already answered a completed key, a
   different-arguments key and a contested call from the key's record, and sent a `started` or
   `indeterminate` key to the replay rules;
2. the run must be known to be bound to the caller's tenant and not known to be quarantined
   (`RunBindings`, below). A run bound to nobody yet (its first call) cannot be: only a verdict
   can say which tenant binds it first, so that call goes verdict-first;
3. `reserved` is appended (`CallProtocol.append_reservation`, its verdict watched for from
   before the append, so a verdict that comes while the tool runs is at hand when it ends);
   until Kafka acknowledges it, nothing runs. No acknowledgement in time (or a cancelled
   caller): `abandoned` is appended in the background and the call is `LedgerUnavailable`, not
   attempted, exactly as verdict-first;
4. the tool runs, its `context.idempotency_key` passed downstream (refused at declaration
   otherwise: `toolledger.runtime.tools`);
5. its outcome is appended (`record`, landing in the background as always) while the
   reservation's verdict is awaited **without giving up** (`await_verdict_after_running`): the
   tool has run, so a missing verdict (projector or PostgreSQL down) is never turned into an
   answer, nor into an abandon; the call waits, and only closing the ledger ends the wait;
6. accepted: the answer is given as verdict-first gives it (`CallPipeline._answer`): the
   outcome was appended after the reservation and before its deadline, so nobody else could
   settle the call first. Refused (`refused`): the tool ran anyway, and the answer is the ledger's:

   - another reservation holds the key: the other system saw the key twice and made one effect,
     so the answer is the holder's outcome, awaited (`replay.lost_reservation`); under run
     fencing, the driver that holds the run holds the call and this one stands down
     (`RunSuperseded`), as verdict-first does;
   - the run was superseded (or finished, or is fenced): `RunSuperseded`, after the tool
     finished; the driver holding the run makes the same call with the same key;
   - the key completed, was reserved with other arguments or became contested after the read:
     the recorded result, `KeyConflictError`, `ToolCallContested`;
   - the run was quarantined meanwhile: `RunQuarantined`.

   The refused reservation's outcome is appended all the same: the decider rejects an outcome
   whose reservation is not the call's current one (`unknown_call`, `not_current_reservation`
   or, once settled, `late_outcome`), never applies it and never marks the call contested for
   it (only an outcome of the settled reservation itself can), so it only lands in the key's
   history as evidence that the tool ran under that reservation.

What this trades: a pipelined call can reach the other system twice (two callers racing on one
key both send before either verdict). The one-effect guarantee then rests on that system
honouring the idempotency key, which is why pipelining is opt-in, refused for approval-gated
tools (an approval must come before anything is sent) and for tools that do not pass the key.

`RunBindings` is this process's memory of what can only become true once about a run: the
tenant its first event bound it to (the decider rejects every later event of another tenant,
so a binding never changes) and a quarantine (never lifted). It is filled from a read of the
run's record on a miss and refreshed from every reservation's verdict (pipelined or not), whose
`run` is the record as the decider saw it. A cached binding is therefore never wrong; what the
cache cannot know is a quarantine that landed after the last record or verdict this process saw
of the run. That one is caught by the reservation's verdict, after the tool ran, as it would be
for any quarantine still on its way to the projector when a fresh read was made.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

from toolledger.events.records import RunRecord, Verdict
from toolledger.port import RuntimePort
from toolledger.runtime import replay
from toolledger.runtime.errors import (
    KeyConflictError,
    RunQuarantined,
    RunSuperseded,
    TenantMismatchError,
)
from toolledger.runtime.executor import CallIdentity
from toolledger.runtime.outcome import ToolOutcome
from toolledger.runtime.protocol import CallProtocol
from toolledger.runtime.tools import PreparedCall, Tool

log = logging.getLogger("toolledger.runtime")

T = TypeVar("T")

#: Verdict reasons that mean this driver no longer holds the run.
_SUPERSEDED = frozenset({"stale_driver", "missing_run_version", "unknown_run", "run_finished"})


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What is known for good about one run: its tenant (None: bound to nobody yet) and, if it
    is quarantined, why."""

    tenant_id: str | None
    quarantine: str | None


class RunBindings:
    """Runs' tenant bindings and quarantines seen by this process (see the module docstring).

    Bounded: a run pushed out is read again on its next pipelined call.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._runs: OrderedDict[str, RunFacts] = OrderedDict()

    def learn(self, run: RunRecord | None) -> None:
        """Remember what `run` (a record just read, or a verdict's) says for good."""
        if run is None or (run.tenant_id is None and not run.quarantined):
            return
        why = (run.quarantine_reason or "an unreadable record") if run.quarantined else None
        self._runs[run.run_id] = RunFacts(run.tenant_id, why)
        self._runs.move_to_end(run.run_id)
        while len(self._runs) > self._limit:
            self._runs.popitem(last=False)

    def get(self, run_id: str) -> RunFacts | None:
        return self._runs.get(run_id)

    def known_bound(self, who: CallIdentity) -> bool:
        """True if the run is known here bound to the caller's tenant and not quarantined:
        `bound_to_caller` would say True without reading or raising."""
        facts = self.get(who.run_id)
        return facts is not None and facts.quarantine is None and facts.tenant_id == who.tenant_id

    async def bound_to_caller(self, port: RuntimePort, tool: str, who: CallIdentity) -> bool:
        """True if the run is bound to the caller's tenant; False if bound to nobody yet. A run
        known quarantined or bound to another tenant is refused here, before anything is sent."""
        facts = self.get(who.run_id)
        if facts is None:
            self.learn(await port.read_run(who.run_id))
            facts = self.get(who.run_id)
        if facts is None:
            return False
        if facts.quarantine is not None:
            raise RunQuarantined(key=who.key, tool=tool, detail=facts.quarantine)
        if facts.tenant_id is None:
            return False
        if facts.tenant_id != who.tenant_id:
            raise TenantMismatchError(key=who.key, tool=tool, tenant_id=who.tenant_id)
        return True


async def refused(
    protocol: CallProtocol,
    tool: Tool[Any, T],
    prepared: PreparedCall,
    who: CallIdentity,
    verdict: Verdict,
    run_version: int | None,
) -> ToolOutcome[T]:
    """The answer for a reservation refused after its tool ran (step 6 of the module
    docstring)."""
    log.warning(
        "pipelined call %s ran before its reservation was refused (%s: %s); its outcome is kept "
        "in the history as evidence",
        who.key,
        verdict.reason,
        verdict.detail,
    )
    reason, record = verdict.reason, verdict.call
    if reason in _SUPERSEDED or (reason == "held" and run_version is not None):
        raise RunSuperseded(key=who.key, tool=tool.name, detail=verdict.detail, ran=True)
    if reason == "quarantined":
        raise RunQuarantined(key=who.key, tool=tool.name, detail=verdict.detail, ran=True)
    if reason == "key_conflict" and record is not None:
        raise KeyConflictError(
            key=who.key,
            tool=tool.name,
            recorded=record.args_digest,
            given=prepared.digest,
            ran=True,
        )
    return await replay.lost_reservation(protocol, tool, prepared, who, verdict, run_version)
