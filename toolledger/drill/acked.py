"""The events a drill's runtimes saw acknowledged, and the check that the log still holds them.

A runtime acts on an acknowledgement: on a verdict it heard (`toolledger.drill.verdicts`) and,
for an outcome appended inside its deadline, on Kafka's acknowledgement alone. With acks=all an
acknowledged record must survive the broker, so a drill that SIGKILLs its broker
(`--broker-kills`) must find every one of them in the log it re-folds afterwards. Each
acknowledged append is written down by the worker (`acked.jsonl`, one `write()` per line, as
the verdicts are) the moment the append returns; the check looks every such event_id, and
every event_id whose verdict was heard, up in the re-fold.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from toolledger.drill.checks import Check
from toolledger.drill.killpoints import append_line, read_lines
from toolledger.events.models import Event

#: The file in the drill's home that workers append acknowledged event_ids to.
ACKED_FILE = "acked.jsonl"


class AckRecord:
    """Appends the events one worker saw acknowledged to the drill's file (None: nowhere)."""

    def __init__(self, path: Path | None, worker: str = "") -> None:
        self.path = path
        self.worker = worker

    def write(self, event: Event) -> None:
        if self.path is not None:
            line = {"worker": self.worker, "pid": os.getpid(), "t": time.time()}
            line |= {"event_id": str(event.event_id), "type": event.type}
            append_line(self.path, line, own_line=True)


def read_acked(path: Path) -> list[str]:
    """The event_ids written to `path` (torn lines skipped)."""
    return [str(line["event_id"]) for line in read_lines(path) if "event_id" in line]


def acknowledged_kept(
    heard: Collection[str], acked: Collection[str], refolded: Mapping[str, Mapping[str, Any]]
) -> Check:
    """Every event a runtime saw acknowledged (a verdict heard, or an append acknowledged) has a
    verdict in the re-fold of the log, which folds only what the broker still holds."""
    wanted = set(heard) | set(acked)
    missing = sorted(wanted - set(refolded))
    detail = (
        f"{len(wanted)} acknowledged events checked ({len(set(acked))} appends), all in the log"
    )
    if missing:
        detail = f"{len(missing)} of {len(wanted)} acknowledged events missing: {missing[:3]}"
    return Check("no acknowledged event lost", not missing, detail)
