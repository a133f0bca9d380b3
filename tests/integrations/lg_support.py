"""A LangGraph checkpointer that a new process can resume from, for the process tests.

`FileSaver` is LangGraph's own `InMemorySaver`, written to a file after every checkpoint and
every pending write, and read back when a process opens it: the same persistence contract as
LangGraph's SQLite or PostgreSQL savers (the model's `AIMessage` with its tool call ids is
saved when the model node finishes, before the tools node runs), without their packages.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver


class FileSaver(InMemorySaver):
    """`InMemorySaver` whose storage survives the process, in one pickle file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        if path.exists():
            storage, writes, blobs = pickle.loads(path.read_bytes())  # noqa: S301 - our file
            for thread, namespaces in storage.items():
                for namespace, checkpoints in namespaces.items():
                    self.storage[thread][namespace].update(checkpoints)
            self.writes.update(writes)
            self.blobs.update(blobs)

    def _save(self) -> None:
        storage = {t: {n: dict(c) for n, c in ns.items()} for t, ns in self.storage.items()}
        # One temporary file per process: two processes resuming one thread save at once, and
        # with a shared name one's rename took the other's file away (FileNotFoundError in CI).
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps((storage, dict(self.writes), dict(self.blobs))))
        tmp.replace(self.path)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        saved = super().put(*args, **kwargs)
        self._save()
        return saved

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        super().put_writes(*args, **kwargs)
        self._save()
