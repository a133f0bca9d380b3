"""Before and after in one run: a benchmark's child processes on this tree and on a git revision.

The machine is shared and its speed moves by tens of percent within minutes, so a change is
measured by running the same benchmark on the package as it was (`git archive` of `REV`'s
`toolledger/` into a temporary folder, first on `PYTHONPATH`) and on this tree, alternating
child processes, and comparing medians. The benchmark code itself is always this tree's; only
the package under it differs. Each child prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def child_output(cost_s: float, floor_s: float) -> str:
    """What a child prints: its per-unit CPU and floor (us) and where toolledger came from."""
    import toolledger

    return json.dumps(
        {"cpu_us": cost_s * 1e6, "floor_us": floor_s * 1e6, "from": toolledger.__file__}
    )


def compare(module: str, size: int, baseline: str, repeat: int, what: str) -> None:
    """`python -m module --child size` on `baseline` and on this tree, alternating (which goes
    first alternates too), `repeat` times each; prints each tree's median `cpu_us` and ratio."""
    samples: dict[str, list[float]] = {"baseline": [], "this tree": []}
    floors: dict[str, list[float]] = {"baseline": [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="toolledger-baseline-") as tmp:
        trees = {"baseline": export_tree(baseline, Path(tmp)), "this tree": None}
        for rep in range(repeat):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for name in order:
                child = run_child(module, ["--child", str(size)], trees[name])
                samples[name].append(float(child["cpu_us"]))
                floors[name].append(float(child["floor_us"]))
            line = ", ".join(f"{n} {v[-1]:.1f}" for n, v in samples.items())
            print(f"  {rep + 1}/{repeat}: {what} (us): {line}", file=sys.stderr, flush=True)
    base = statistics.median(samples["baseline"])
    base_floor = statistics.median(floors["baseline"]) or 1.0
    print(f"{what}, median of {repeat} child runs each (size {size}), baseline {baseline}")
    for name, values in samples.items():
        value, floor = statistics.median(values), statistics.median(floors[name])
        print(
            f"{name:<10} {value:>8.1f} us  {value / base:.3f}x"
            f"   floor {floor:>8.1f} us  {floor / base_floor:.3f}x"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--repeat`, `--baseline REV` and the children's hidden `--child SIZE`."""
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (medians reported)")
    parser.add_argument("--baseline", help="a git revision to compare this tree with")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
