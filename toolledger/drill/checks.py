"""The checks after a drill: what the ledger, the billing system and the log must agree on.

Each check names the guarantee it is evidence for. They read three independent witnesses: the
ledger's final snapshot (records, runs, history), the billing system's own tables (effects and
every request, `toolledger.drill.billing`), and a re-fold of the log into a fresh schema. What
billing can prove is limited to what reached it: a request that never arrived leaves no trace,
which is why "no completed call ran twice" counts requests (every arrival) and not only credits
(which the idempotency key already dedups), and why "one effect per step" groups credits by the
memo the model put in the arguments, so a second charge under a new key is caught too. A call
settled by resending its request with the same key (`drill.refund`, declared `replays_key_for`)
reaches billing again on purpose: those replays are the ledger's lookups, so for such a call
the check counts the credits made rather than the requests.

Two checks judge what the drill did rather than what the ledger kept, and both are written so
that a loaded machine cannot fail them on a count alone: the kill check asks for every kind of
runtime kill at least once (the driver retries a kind whose plan missed), not for the exact
budget; and a drill that ran out of time says so in a check of its own, while the checks of
effects count the calls still in flight at that moment as in flight, not as untruthful records.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolledger.drill.billing import Effect
from toolledger.drill.killpoints import KILL_KINDS
from toolledger.drill.model import memo, step_of
from toolledger.drill.operator import ListingChecks
from toolledger.drill.verdicts import Heard
from toolledger.events.fold import HistoryEntry
from toolledger.events.records import UNSETTLED, CallRecord
from toolledger.projections.store import LedgerSnapshot


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    #: What the summary says when the check does not hold.
    failed_as: str = "VIOLATED"


@dataclass(frozen=True)
class Refold:
    """The live ledger against a re-fold of the log up to the live offsets."""

    live_digest: str
    replay_digest: str
    events: int
    differences: list[str]
    #: The re-fold's verdict (`verdicts.verdict_form`) of each event_id a runtime heard.
    verdicts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return not self.differences and self.live_digest == self.replay_digest


@dataclass
class Evidence:
    """Everything the checks read."""

    snapshot: LedgerSnapshot
    effects: list[Effect]
    requests: Mapping[str, Counter[str]]
    runs: list[str]
    calls: int
    tenant: str
    reconciler_pids: set[int]
    listing: ListingChecks
    unsettled_at_end: set[str]
    listed_at_end: set[str]
    refold: Refold
    poison: list[str]
    #: Runtime kills delivered, by kind (`KILL_KINDS`, and "unattributed").
    kills: Mapping[str, int]
    kills_requested: int
    unattributed_kills: int
    errors: list[str]
    #: The kinds the drill meant to deliver (`Dispatcher.kill_kinds`).
    kill_kinds: tuple[str, ...] = KILL_KINDS
    #: The drill's time limit (s), and whether it ran out before every run finished.
    timeout: float = 0.0
    timed_out: bool = False
    zombies: int = 0
    zombies_stood_down: int = 0
    identity_stops: list[str] = field(default_factory=list)
    #: Every verdict a runtime worker heard (`toolledger.drill.verdicts`).
    heard: list[Heard] = field(default_factory=list)
    #: The tools whose unknown calls are settled by resending (`replays_key_for`).
    resent_tools: frozenset[str] = frozenset()


@dataclass
class Tally:
    """The numbers of the summary table that come from the witnesses."""

    keys: int = 0
    completed: int = 0
    failed: int = 0
    effects: int = 0
    requests: int = 0
    refused: int = 0
    duplicates: int = 0
    #: Calls the ledger did not learn the outcome of from their runtime in time: `started`
    #: ones whose runtime died or hung, and those the runtime itself reported indeterminate.
    unknowns: int = 0
    indeterminate: int = 0
    #: Who settled the unknowns: "reconciler", "resume" (a resuming runtime asking the hook),
    #: "operator", or "late runtime" (its own runtime, after an unknown was recorded).
    settled: Counter[str] = field(default_factory=Counter)
    unsettled: int = 0
    #: Verdicts the runtimes heard, by the path that answered them ("leader", "direct").
    heard: Counter[str] = field(default_factory=Counter)
    #: Effects by the tool of the call that made them.
    effects_by_tool: Counter[str] = field(default_factory=Counter)
    #: Calls settled by resending their request with the same key, and billing's replays.
    resent: int = 0
    lookups: int = 0


def judge(ev: Evidence) -> tuple[list[Check], Tally]:
    calls = {k: c for k, c in ev.snapshot.calls.items() if c.tenant_id == ev.tenant}
    history: dict[str, list[HistoryEntry]] = defaultdict(list)
    for entry in ev.snapshot.history:
        history[entry.key].append(entry)
    by_key: dict[str, list[Effect]] = defaultdict(list)
    by_step: dict[str, list[Effect]] = defaultdict(list)
    for effect in ev.effects:
        by_key[effect.key].append(effect)
        by_step[effect.memo].append(effect)
    tally = _tally(ev, calls, history, by_key, by_step)
    checks = [
        _runs_finished(ev),
        _one_record_per_key(ev, calls, history),
        _at_most_one_effect(by_key, by_step, tally),
        _one_effect_per_call_of_finished_runs(ev, calls, history, by_step),
        _no_completed_call_ran_twice(ev, calls, history),
        _effects_match_the_ledger(calls, by_key, in_flight_ok=ev.timed_out),
        _unsettled_listed(ev),
        _refold(ev.refold),
        _heard_verdicts_are_the_logs(ev.heard, ev.refold.verdicts),
        _poison(ev),
        _kills(ev),
        Check(
            "no unexpected runtime errors",
            not ev.errors,
            f"{len(ev.errors)} errors; first: {ev.errors[0][:1500]}" if ev.errors else "none",
        ),
        Check(
            "no projector stopped with the log-identity error on an intact log",
            not ev.identity_stops,
            f"{len(ev.identity_stops)}; first: {ev.identity_stops[0][:400]}"
            if ev.identity_stops
            else "none",
        ),
        Check(
            "zombie projectors stood down",
            ev.zombies_stood_down == ev.zombies,
            f"{ev.zombies_stood_down} of {ev.zombies} reported losing their partitions or exited",
        ),
    ]
    return checks, tally


def _tally(
    ev: Evidence,
    calls: Mapping[str, CallRecord],
    history: Mapping[str, list[HistoryEntry]],
    by_key: Mapping[str, list[Effect]],
    by_step: Mapping[str, list[Effect]],
) -> Tally:
    tally = Tally(keys=len(calls), effects=len(ev.effects))
    tally.heard = Counter(h.via for h in ev.heard)
    tally.effects_by_tool = Counter(
        calls[e.key].tool if e.key in calls else "(no ledger record)" for e in ev.effects
    )
    resent = resent_keys(ev, calls, history)
    tally.resent = len(resent)
    tally.lookups = sum(ev.requests.get(k, Counter())["replayed"] for k in resent)
    tally.requests = sum(sum(c.values()) for c in ev.requests.values())
    tally.refused = sum(c["refused"] for c in ev.requests.values())
    tally.duplicates = sum(len(e) - 1 for e in by_key.values() if len(e) > 1) + sum(
        len(e) - 1 for e in by_step.values() if len(e) > 1
    )
    for key, record in calls.items():
        tally.completed += record.status == "completed"
        tally.failed += record.status == "failed"
        accepted = {h.event_type for h in history.get(key, []) if h.accepted}
        tally.indeterminate += "call_indeterminate" in accepted
        if record.status in UNSETTLED:
            tally.unsettled += 1
        elif record.settled_by == "operator":
            tally.settled["operator"] += 1
        elif record.settled_by == "reconcile":
            tally.settled[_reconciled_by(history.get(key, []), ev.reconciler_pids)] += 1
        elif accepted & {"call_indeterminate", "reconcile_attempted"}:
            tally.settled["late runtime"] += 1
        else:
            continue
        tally.unknowns += 1
    return tally


def _reconciled_by(entries: Iterable[HistoryEntry], reconciler_pids: set[int]) -> str:
    """Who found a reconciled call's outcome: the reconciler process or a resuming runtime."""
    for entry in reversed(list(entries)):
        if entry.accepted and entry.actor.startswith("reconcile:"):
            pid = entry.actor.rsplit("/", 1)[-1]
            return "reconciler" if pid.isdigit() and int(pid) in reconciler_pids else "resume"
    return "reconciler"


def _runs_finished(ev: Evidence) -> Check:
    if ev.timed_out:
        done = sum(
            1
            for r in ev.runs
            if r in ev.snapshot.runs and ev.snapshot.runs[r].status == "completed"
        )
        return Check(
            "every run finished within the drill's timeout",
            False,
            f"timed out after {ev.timeout:.0f} s with {done} of {len(ev.runs)} runs completed "
            "in the ledger; "
            "the other checks judged what was done by then. Give it longer (--timeout) or "
            "fewer runs",
            failed_as="TIMED OUT",
        )
    statuses = Counter(
        (ev.snapshot.runs[r].status if r in ev.snapshot.runs else "never started") for r in ev.runs
    )
    unfinished = [
        r for r in ev.runs if r not in ev.snapshot.runs or ev.snapshot.runs[r].status != "completed"
    ]
    detail = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    if unfinished:
        detail += f"; e.g. {', '.join(unfinished[:5])}"
    return Check("every run finished within the drill's timeout", not unfinished, detail)


def _one_record_per_key(
    ev: Evidence, calls: Mapping[str, CallRecord], history: Mapping[str, list[HistoryEntry]]
) -> Check:
    problems = []
    accepted = {
        k for k, entries in history.items() if ":" in k and any(e.accepted for e in entries)
    }
    no_record = sorted(k for k in accepted if k not in ev.snapshot.calls)
    if no_record:
        problems.append(
            f"{len(no_record)} keys with accepted events but no record: {no_record[:5]}"
        )
    ran_unreserved = sorted(k for k in ev.requests if k not in calls)
    if ran_unreserved:
        problems.append(
            f"{len(ran_unreserved)} keys reached billing without a ledger record: "
            f"{ran_unreserved[:5]}"
        )
    applied = Counter(h.event_id for h in ev.snapshot.history)
    twice = [str(e) for e, n in applied.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} event_ids applied more than once: {twice[:3]}")
    detail = (
        f"{len(calls)} keys, {len(applied)} events each applied once"
        if not problems
        else "; ".join(problems)
    )
    return Check("exactly one ledger record per key", not problems, detail)


def _at_most_one_effect(
    by_key: Mapping[str, list[Effect]], by_step: Mapping[str, list[Effect]], tally: Tally
) -> Check:
    keys = sorted(k for k, e in by_key.items() if len(e) > 1)
    steps = sorted(s for s, e in by_step.items() if len(e) > 1)
    detail = f"{tally.duplicates} duplicate effects"
    if keys or steps:
        detail += f" (keys {keys[:5]}, steps {steps[:5]})"
    return Check("at most one external effect per key and per step", not (keys or steps), detail)


def _final_credits(entries: Iterable[HistoryEntry]) -> list[str] | None:
    """The credit ids of the model's final answer, from the run's accepted `run_finished`."""
    for entry in entries:
        if entry.accepted and entry.event_type == "run_finished":
            detail = str(json.loads(entry.event_json).get("detail", ""))
            _, _, ids = detail.rpartition(": ")
            return [i.strip() for i in ids.split(",") if i.strip()]
    return None


def _one_effect_per_call_of_finished_runs(
    ev: Evidence,
    calls: Mapping[str, CallRecord],
    history: Mapping[str, list[HistoryEntry]],
    by_step: Mapping[str, list[Effect]],
) -> Check:
    problems: list[str] = []
    judged = 0
    for run in ev.runs:
        record = ev.snapshot.runs.get(run)
        if record is None or record.status != "completed":
            continue
        told = _final_credits(history.get(run, []))
        if told is None or len(told) != ev.calls:
            problems.append(f"run {run}: its final answer lists {told}")
            continue
        for step in range(ev.calls):
            judged += 1
            effects = by_step.get(memo(run, step), [])
            if len(effects) != 1:
                problems.append(f"{memo(run, step)} has {len(effects)} effects")
                continue
            effect = effects[0]
            call = calls.get(effect.key)
            result = json.loads(call.result_json or "{}") if call is not None else {}
            if call is None or call.status != "completed" or call.run_id != run:
                problems.append(
                    f"{memo(run, step)}: its credit's key {effect.key} is not completed"
                )
            elif step_of(call.tool_call_id) != step or result.get("credit_id") != effect.credit_id:
                problems.append(f"{effect.key}: the ledger's result is not the credit made")
            elif told[step] != effect.credit_id:
                problems.append(f"{memo(run, step)}: the model was told {told[step]}")
    detail = f"{judged} steps of finished runs: one credit each, recorded and told to the model"
    if problems:
        detail = f"{len(problems)} problems: {problems[:5]}"
    return Check("exactly one effect for every call of a finished run", not problems, detail)


def resent_keys(
    ev: Evidence, calls: Mapping[str, CallRecord], history: Mapping[str, list[HistoryEntry]]
) -> set[str]:
    """Keys of calls the ledger settled by resending their request with the same key (tools
    declared `replays_key_for`): every resend is ledgered as a reconcile attempt, and the call
    is then settled by reconcile. Billing replays such a key's first credit, and that replay is
    the lookup, not a second run. (A resender killed before its attempt landed leaves a replay
    without an attempt; the call is still settled by a later resend, so by reconcile.)"""
    return {
        key
        for key, call in calls.items()
        if call.tool in ev.resent_tools
        and (
            call.settled_by == "reconcile"
            or any(e.event_type == "reconcile_attempted" for e in history.get(key, []))
        )
    }


def _no_completed_call_ran_twice(
    ev: Evidence, calls: Mapping[str, CallRecord], history: Mapping[str, list[HistoryEntry]]
) -> Check:
    resent = resent_keys(ev, calls, history)

    def runs(key: str) -> int:
        """How often the call took effect: credits made, and for a key that was never resent
        every request (a repeated request of a completed call is a rerun)."""
        found = ev.requests.get(key, Counter())
        return found["credited"] if key in resent else sum(found.values())

    twice = sorted(k for k, c in calls.items() if c.status == "completed" and runs(k) != 1)
    replayed = sorted(k for k, c in ev.requests.items() if c["replayed"] and k not in resent)
    completed = sum(1 for c in calls.values() if c.status == "completed")
    lookups = sum(ev.requests.get(k, Counter())["replayed"] for k in resent)
    detail = (
        f"{completed} completed calls, each reached billing exactly once, but for "
        f"{len(resent)} settled by resending (their {lookups} replays were the lookups)"
    )
    if twice or replayed:
        detail = (
            f"completed calls reaching billing other than once: {twice[:5]}; requests for a key "
            f"that already had its credit, never resent: {replayed[:5]}"
        )
    return Check("no completed call ran twice", not (twice or replayed), detail)


def _effects_match_the_ledger(
    calls: Mapping[str, CallRecord], by_key: Mapping[str, list[Effect]], *, in_flight_ok: bool
) -> Check:
    """Every credit's call is completed, and no failed call took effect.

    With `in_flight_ok` (the drill timed out), a credit whose call is still unsettled is a call
    in flight when the time ran out: its record says "not known yet", which is the truth.
    """
    problems = []
    in_flight = 0
    for key in by_key:
        call = calls.get(key)
        if in_flight_ok and call is not None and call.status in UNSETTLED:
            in_flight += 1
        elif call is None or call.status != "completed":
            problems.append(f"{key} took effect but the ledger says {call and call.status}")
    for key, call in calls.items():
        if call.status == "failed" and key in by_key:
            problems.append(f"{key} is failed but took effect")
    detail = "every credit's call is completed; no failed call took effect"
    if in_flight:
        detail = (
            f"every credit's call is completed or was in flight at the time-out ({in_flight}, "
            "still unsettled); no failed call took effect"
        )
    return Check(
        "the ledger tells the truth about effects",
        not problems,
        detail if not problems else f"{len(problems)}: {problems[:5]}",
    )


def _unsettled_listed(ev: Evidence) -> Check:
    missing_now = sorted(ev.unsettled_at_end - ev.listed_at_end)
    missing = sorted(ev.listing.missing | set(missing_now))
    detail = (
        f"{ev.listing.passes} listings judged {ev.listing.judged} unsettled calls; "
        f"{len(ev.unsettled_at_end)} unsettled at the end"
    )
    if missing:
        detail += f"; missing from the listing: {missing[:5]}"
    return Check("every unsettled call listed by the operator API", not missing, detail)


def _refold(refold: Refold) -> Check:
    detail = (
        f"{refold.events} events re-folded, digest {refold.replay_digest[:16]}"
        if refold.identical
        else f"live {refold.live_digest[:16]} != replay {refold.replay_digest[:16]}; "
        f"{refold.differences[:5]}"
    )
    return Check("the ledger equals a re-fold of the log", refold.identical, detail)


def _heard_verdicts_are_the_logs(
    heard: list[Heard], refolded: Mapping[str, Mapping[str, Any]]
) -> Check:
    """Every verdict a runtime acted on is the one the log's re-fold reaches for its event_id.

    A leader answers from memory before anything is committed, a zombie leader may answer after
    it was superseded, and a resend may be answered twice: any of them telling a runtime what
    the log does not say is a lie the ledger itself cannot show, because the projection only
    holds what was committed. Only the runtime's own record of what it heard can.
    """
    problems = []
    for h in heard:
        found = refolded.get(h.event_id)
        if found is None:
            problems.append(f"{h.event_id} ({h.form.get('event_type')}): the log has no verdict")
            continue
        fields = sorted(k for k in h.form.keys() | found.keys() if h.form.get(k) != found.get(k))
        if fields:
            told = ", ".join(f"{k} {h.form.get(k)!r} != {found.get(k)!r}" for k in fields)
            problems.append(f"{h.event_id} ({h.form.get('event_type')}, {h.via}): {told}")
    by_path = Counter(h.via for h in heard)
    detail = (
        f"{len(heard)} verdicts heard ({by_path['leader']} from leaders, {by_path['direct']} "
        "direct), each the re-fold's for its event_id"
    )
    if problems:
        detail = f"{len(problems)} of {len(heard)} differ from the re-fold: {problems[:3]}"
    return Check("every verdict a runtime heard is the re-fold's", not problems, detail)


def _poison(ev: Evidence) -> Check:
    problems = []
    if ev.snapshot.dead_letters != len(ev.poison):
        problems.append(f"{ev.snapshot.dead_letters} dead letters for {len(ev.poison)} poisoned")
    for run in ev.poison:
        record = ev.snapshot.runs.get(run)
        if record is None or not record.quarantined:
            problems.append(f"{run} is not quarantined")
    hit = [r for r in ev.runs if r in ev.snapshot.runs and ev.snapshot.runs[r].quarantined]
    if hit:
        problems.append(f"drill runs quarantined: {hit[:5]}")
    detail = f"{len(ev.poison)} poisoned records dead-lettered, their runs quarantined, no other"
    return Check(
        "poison events dead-lettered", not problems, detail if not problems else str(problems)
    )


def _kills(ev: Evidence) -> Check:
    """Every kind of runtime kill at least once (as many kinds as kills were asked for), and
    every kill the drill's own.

    Not "as many kills as requested": a plan misses when its worker finishes first, which a
    loaded machine makes common ("28 of 30 requested" failed a drill whose every kind had
    struck). The driver retries the kinds it missed, so a kind never delivered means the
    drill could not deliver it, and that is the violation.
    """
    done = sum(ev.kills.values())
    wanted = ev.kill_kinds[: max(0, min(ev.kills_requested, len(ev.kill_kinds)))]
    delivered = [k for k in ev.kill_kinds if ev.kills.get(k)]
    missing = [k for k in ev.kill_kinds if not ev.kills.get(k)]
    enough = len(delivered) >= len(wanted)
    by_kind = ", ".join(f"{k} {ev.kills.get(k, 0)}" for k in ev.kill_kinds)
    detail = f"{done} kills ({ev.kills_requested} planned): {by_kind}"
    if not enough:
        detail += f"; never delivered: {', '.join(missing)}"
    if ev.unattributed_kills:
        detail += f"; {ev.unattributed_kills} workers died of SIGKILL at no known point"
    return Check(
        "every kind of runtime kill delivered", enough and ev.unattributed_kills == 0, detail
    )
