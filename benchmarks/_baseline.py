"""Before and after in one run: a benchmark's child processes on this tree and on a git revision.

The machine is shared and its speed moves by tens of percent within minutes, so a change is
measured by running the same benchmark on the package as it was (`git archive` of `REV`'s
`toolledger/` into a temporary folder, first on `PYTHONPATH`) and on this tree, alternating
child processes, and comparing medians. The benchmark code itself is always this tree's; only
the package under it differs. Each child prints one JSON object as its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def export_tree(rev: str, into: Path) -> Path:
    """`toolledger/` as it was at `rev`, extracted under `into` (returned)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "toolledger"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_child(module: str, argv: list[str], tree: Path | None) -> dict[str, Any]:
    """`python -m module argv...` with `toolledger` from `tree` (None: this tree); its JSON.

    Raises if the child imported `toolledger` from anywhere else."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (tree, ROOT) if p is not None)
    out = subprocess.run(
        [sys.executable, "-m", module, *argv],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree if tree is not None else ROOT,  # `-m` puts the cwd first on the path
        env=env,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    expected = tree if tree is not None else ROOT
    if not str(result.get("from", "")).startswith(str(expected)):
        raise RuntimeError(f"{module} imported toolledger from {result.get('from')}")
    return result
