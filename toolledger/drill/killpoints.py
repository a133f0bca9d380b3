"""Kill points: where a drill worker SIGKILLs itself, so every kill is attributed to a moment.

An external SIGKILL lands wherever the process happens to be; it proves recovery from anywhere
but cannot say from where. A kill point is a named place in the worker's code path (inside the
model call, right after a reservation was accepted, ...) that counts how often it was reached;
the worker's plan says "die at the n-th time point P is reached". Before dying it appends one
line to the kill log, so the summary can count kills by point. The line is written with one
`write()` to a file opened with O_APPEND, which the kernel keeps whole even when several
workers write at once, and the SIGKILL to itself follows synchronously: no other coroutine of
the worker runs in between.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

#: Where a worker can kill itself, in the order a call meets them.
KillPoint = Literal[
    "model",  # during a model call (the step's answer is not checkpointed yet)
    "reserved",  # the reservation was accepted; the tool has not run
    "request_lost",  # the request left (inside `sending()`) and never reached billing
    "response_lost",  # billing made the credit; the response never came back
    "before_outcome",  # the tool returned; its outcome was not appended yet
    "after_outcome",  # the outcome was acknowledged; the run has not moved on yet
]
KILL_POINTS: tuple[KillPoint, ...] = get_args(KillPoint)
#: The label of kills the drill driver sends from outside, at a random moment.
EXTERNAL = "external"
#: Every kind of runtime kill a drill delivers: each kill point, and the external SIGKILL.
KILL_KINDS: tuple[str, ...] = (*KILL_POINTS, EXTERNAL)


def kinds_owed(
    kinds: tuple[str, ...], done: Mapping[str, int], planned: Iterable[str | None]
) -> list[str]:
    """The kinds of kill not delivered yet and not in any live worker's plan, in `kinds` order.

    A plan can miss: the worker finishes its runs before it reaches its point the n-th time,
    or an external kill comes after its worker exited. Under load that happens more often, so
    the driver aims its next plans at the kinds still owed (again and again, past the kill
    budget if need be, while runs are left to carry them): the drill then proves recovery
    from every kind, which a count of kills alone never promised.
    """
    aimed = set(planned)
    return [kind for kind in kinds if not done.get(kind) and kind not in aimed]


@dataclass(frozen=True)
class KillPlan:
    """Die at the `nth` time `point` is reached (none: never)."""

    point: KillPoint | None = None
    nth: int = 0

    def encode(self) -> str:
        return "none" if self.point is None else f"{self.point}:{self.nth}"

    @classmethod
    def parse(cls, text: str) -> KillPlan:
        if text == "none":
            return cls()
        point, _, nth = text.partition(":")
        if point not in KILL_POINTS or not nth.isdigit() or int(nth) < 1:
            raise ValueError(f"{text!r}: expected none or POINT:N with POINT in {KILL_POINTS}")
        return cls(point, int(nth))


class KillPoints:
    """Counts the points a worker reaches and kills it where its plan says."""

    def __init__(self, plan: KillPlan, log: Path | None, worker: str = "") -> None:
        #: May be replaced until the worker starts driving runs.
        self.plan = plan
        self.log = log
        self.worker = worker
        self.reached: Counter[str] = Counter()

    @classmethod
    def disabled(cls) -> KillPoints:
        return cls(KillPlan(), None)

    def reach(self, point: KillPoint, detail: str = "") -> None:
        """Count `point`; SIGKILL this process if the plan says this is the moment."""
        self.reached[point] += 1
        if point != self.plan.point or self.reached[point] != self.plan.nth:
            return
        line = {
            "point": point,
            "worker": self.worker,
            "pid": os.getpid(),
            "t": time.time(),
            "detail": detail,
        }
        if self.log is not None:
            append_line(self.log, line)
        os.kill(os.getpid(), signal.SIGKILL)
        while True:  # pragma: no cover -- the signal is delivered before this runs
            time.sleep(1)


def append_line(path: Path, line: Mapping[str, object], *, own_line: bool = False) -> None:
    """Append one JSON line in a single write (kept whole even with concurrent writers).

    With `own_line` it starts with a newline too: a SIGKILL can still cut a write short where
    it crosses a page of the file (Linux stops copying between pages for a fatal signal), and
    the torn line must not swallow the next writer's (`read_lines` skips the empty line)."""
    text = ("\n" if own_line else "") + json.dumps(line, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of `path` (a torn line, which single writes rarely leave, is skipped)."""
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue
    return lines
