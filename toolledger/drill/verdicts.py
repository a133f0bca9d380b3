"""The verdicts a drill's runtimes heard, one JSON line each, and the form they are compared in.

Every verdict a runtime worker receives (a reservation's, an outcome's awaited after its
deadline, a run event's) is appended to `verdicts.jsonl` in the drill's home before the runtime
acts on it, with the path that answered (`leader` or `direct`, `toolledger.drill.port`). The
line is one `write()` to a file opened with O_APPEND (`killpoints.append_line`): the kernel has
it once the call returns, whatever kills the worker next. A SIGKILL during the write can cut it
short, so each line also starts on a line of its own: a torn one is skipped on reading
(`killpoints.read_lines`), never misread, and never takes the next worker's line with it.

What a line holds is `verdict_form`: the verdict's headline (event, accepted, reason, detail,
the call's status and version, the run's version) and a digest of the records it left behind.
The same form of the verdict the re-fold of the log reached for that event_id must be equal
(`checks`). Payload fields are compared by their SHA-256 (a blob's digest is that already), so
a verdict whose payloads travelled by reference and one that has them inline compare equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolledger.drill.killpoints import append_line, read_lines
from toolledger.events.records import CallRecord, RunRecord, Verdict

#: The file in the drill's home that every worker appends the verdicts it heard to.
VERDICTS_FILE = "verdicts.jsonl"
#: Which path answered a verdict: a partition leader from memory, or the durable verdict.
Via = Literal["leader", "direct"]

_CALL_PAYLOADS = (("arguments_json", "arguments_blob"), ("result_json", "result_blob"))
_RUN_PAYLOADS = (("state_json", "state_blob"),)


def _record_form(
    record: CallRecord | RunRecord | None, payloads: tuple[tuple[str, str], ...]
) -> dict[str, Any] | None:
    if record is None:
        return None
    form = record.ledger_form()
    for text_field, blob_field in payloads:
        blob, text = form.pop(blob_field, None), form[text_field]
        form[text_field] = blob or (text and hashlib.sha256(text.encode()).hexdigest())
    return form


#: What a line holds besides the verdict's form.
_LINE_KEYS = frozenset({"worker", "pid", "t", "via"})


def verdict_form(verdict: Verdict) -> dict[str, Any]:
    """What of `verdict` the re-fold must reproduce, as JSON values (see the module)."""
    left = {
        "call": _record_form(verdict.call, _CALL_PAYLOADS),
        "run": _record_form(verdict.run, _RUN_PAYLOADS),
    }
    state = json.dumps(left, sort_keys=True, separators=(",", ":"))
    return {
        "event_id": str(verdict.event_id),
        "event_type": verdict.event_type,
        "key": verdict.key,
        "accepted": verdict.accepted,
        "reason": verdict.reason,
        "detail": verdict.detail,
        "call_status": verdict.call.status if verdict.call else None,
        "call_version": verdict.call.version if verdict.call else None,
        "run_version": verdict.run.version if verdict.run else None,
        "state": hashlib.sha256(state.encode()).hexdigest()[:32],
    }


class VerdictRecord:
    """Appends the verdicts one worker hears to the drill's verdict file (None: nowhere)."""

    def __init__(self, path: Path | None, worker: str = "") -> None:
        self.path = path
        self.worker = worker

    def write(self, verdict: Verdict, via: Via) -> None:
        if self.path is not None:
            line = {"worker": self.worker, "pid": os.getpid(), "t": time.time(), "via": via}
            append_line(self.path, {**line, **verdict_form(verdict)}, own_line=True)


@dataclass(frozen=True)
class Heard:
    """One verdict a runtime heard: the path that answered it, and its `verdict_form`."""

    event_id: str
    via: Via
    form: dict[str, Any]


def read_heard(path: Path) -> list[Heard]:
    """Every verdict written to `path`, in the order written (torn lines skipped)."""
    heard = []
    for line in read_lines(path):
        via: Via = "leader" if line.get("via") == "leader" else "direct"
        form = {k: v for k, v in line.items() if k not in _LINE_KEYS}
        heard.append(Heard(str(line.get("event_id")), via, form))
    return heard
