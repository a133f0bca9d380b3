"""The peers benchmark's results: one table of the systems, the ratios, and the checks.

Figures are medians over the rounds. A ratio is the median of the per-round ratios (each round
runs every system back to back, so a round's ratio compares them under one load): each of
toolledger's two flows (verdict-first, pipelined) against each peer; for
throughput it is toolledger's rate over the peer's (above 1: toolledger is ahead); for the serial
p50 and for CPU it is toolledger's over the peer's (above 1: toolledger is slower or costlier).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.peers import sixths
from benchmarks.peers._systems import System


@dataclass(frozen=True)
class Round:
    """One system's figures in one round."""

    #: Seconds, the median of the round's serial steps.
    p50: float
    #: Steps per second of the concurrent phase.
    rate: float
    #: CPU seconds per step of the concurrent phase, by part of the system.
    cpu: dict[str, float]
    #: Seconds, the median of what the system added to serial calls of a 50 ms tool (None: the
    #: system does not measure it), and of the floor measured between them.
    added: float | None = None
    added_floor: float | None = None
    #: Every serial step's seconds, in order, and samples of the concurrent phase.
    serial: list[float] = field(default_factory=list)
    trace: sixths.Trace = field(default_factory=sixths.Trace)

    @property
    def cpu_total(self) -> float:
        return sum(self.cpu.values())


def _cpu(rounds: Sequence[Round], median: Callable[[Sequence[float]], float]) -> str:
    parts = list(rounds[0].cpu)
    by_part = {p: median([r.cpu.get(p, 0.0) for r in rounds]) * 1e6 for p in parts}
    total = median([r.cpu_total for r in rounds]) * 1e6
    detail = " + ".join(f"{p} {v:,.0f}" for p, v in by_part.items() if v > 0)
    return f"{total:,.0f} µs ({detail})"


def render(
    systems: Sequence[System],
    rounds: dict[str, list[Round]],
    idle: dict[str, dict[str, float]],
    checks: Sequence[str],
    note: str,
    median: Callable[[Sequence[float]], float],
) -> str:
    header = (
        "system",
        "serial p50 per step",
        "concurrent throughput",
        "50 ms tool: added p50 / floor",
        "CPU per step",
    )
    lines = [header]
    for system in systems:
        rs = rounds[system.name]
        added = [r.added for r in rs if r.added is not None]
        floor = [r.added_floor for r in rs if r.added_floor is not None]
        lines.append(
            (
                system.name,
                f"{median([r.p50 for r in rs]) * 1000:.2f} ms",
                f"{median([r.rate for r in rs]):,.0f} steps/s",
                f"{median(added) * 1000:.2f} / {median(floor) * 1000:.2f} ms" if added else "-",
                _cpu(rs, median),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    out.append("")
    ours = [s for s in systems if s.name.startswith("toolledger")]
    for mine in ours:
        for peer in (s for s in systems if s not in ours):
            pairs = list(zip(rounds[mine.name], rounds[peer.name], strict=True))
            out.append(
                f"{mine.name} vs {peer.name}: throughput "
                f"{median([a.rate / b.rate for a, b in pairs]):.2f}x, serial p50 "
                f"{median([a.p50 / b.p50 for a, b in pairs]):.2f}x, CPU per step "
                f"{median([a.cpu_total / b.cpu_total for a, b in pairs]):.2f}x"
            )
    out += _goals(rounds, idle, median)
    out += _budget(rounds, median)
    if LEADER in rounds:
        rs = rounds[LEADER]
        cut = sixths.sixths([r.serial for r in rs], [r.trace for r in rs], median)
        out += sixths.render(LEADER, cut)
    out += ["", "idle CPU (nothing asked of it, before the rounds; counted in CPU per step):"]
    for system in systems:
        parts = ", ".join(f"{p} {v * 1000:.0f} ms/s" for p, v in idle[system.name].items())
        out.append(f"  {system.name}: {parts}")
    out += ["", "durable per step:"]
    out += [f"  {s.name}: {s.durable}" for s in systems]
    out += ["", "checks:", *(f"  {c}" for c in checks), "", note]
    return "\n".join(out)


#: CPU per step each part of the leader row may take (issue 46), in µs.
BUDGET = {"runtime": 150, "projector": 220, "PostgreSQL": 100, "broker": 60}


def _budget(
    rounds: dict[str, list[Round]], median: Callable[[Sequence[float]], float]
) -> list[str]:
    """The leader row's CPU per step, part by part, against issue 46's budget."""
    if LEADER not in rounds:
        return []
    lines = ["", f"{LEADER}: CPU per step against its budget (issue 46):"]
    for part, budget in BUDGET.items():
        value = median([r.cpu.get(part, 0.0) for r in rounds[LEADER]]) * 1e6
        lines.append(
            f"  {part}: {value:,.0f} µs (budget <= {budget} µs) "
            f"{'met' if value <= budget else 'not met'}"
        )
    total = median([r.cpu_total for r in rounds[LEADER]]) * 1e6
    lines.append(f"  total: {total:,.0f} µs (about {sum(BUDGET.values())} µs)")
    return lines


#: The systems the fast path's goals (issue 25) are read from, and the peer they name.
LEADER = "toolledger leader"
LEADER_PIPELINED = "toolledger leader pipelined"
PEER = "Restate"


def _goals(
    rounds: dict[str, list[Round]],
    idle: dict[str, dict[str, float]],
    median: Callable[[Sequence[float]], float],
) -> list[str]:
    """The leader's rows against issue 25's goals, when the run had the leader and Restate."""
    if LEADER not in rounds or PEER not in rounds:
        return []

    def ratio(mine: str, figure: Callable[[Round], float]) -> float:
        pairs = zip(rounds[mine], rounds[PEER], strict=True)
        return median([figure(a) / figure(b) for a, b in pairs])

    def rate(r: Round) -> float:
        return r.rate

    def p50(r: Round) -> float:
        return r.p50

    def cpu(r: Round) -> float:
        return r.cpu_total

    rows = [
        ("64-way throughput", ratio(LEADER, rate), ">= 1.0x Restate", ratio(LEADER, rate) >= 1.0),
        ("serial p50 per step", ratio(LEADER, p50), "<= 1.5x Restate", ratio(LEADER, p50) <= 1.5),
        ("CPU per step", ratio(LEADER, cpu), "<= 1.2x Restate", ratio(LEADER, cpu) <= 1.2),
    ]
    lines = ["", "the leader fast path against its goals (issue 25):"]
    for what, value, goal, met in rows:
        lines.append(f"  {what}: {value:.2f}x (goal {goal}) {'met' if met else 'not met'}")
    piped = [r for r in rounds.get(LEADER_PIPELINED, []) if r.added and r.added_floor]
    if piped:
        added = median([r.added / r.added_floor for r in piped if r.added and r.added_floor])
        lines.append(
            f"  pipelined 50 ms tool: adds {added:.2f}x its floor (a read and two acknowledged "
            "appends, measured between the calls; goal <= 1.3x)"
        )
    quiet = sum(idle.get(LEADER, {}).values()) * 1000
    lines.append(
        f"  idle CPU of the stack (runtime + projector + PostgreSQL + broker): {quiet:.0f} ms/s "
        f"(goal <= 30 ms/s) {'met' if quiet <= 30 else 'not met'}"
    )
    return lines
