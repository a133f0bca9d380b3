"""How long `toolledger --help` takes, in this checkout and in another one, side by side.

    .venv/bin/python -m scripts.help_time --before /path/to/old/checkout [--runs 15] [ARGS...]

Each run starts a fresh interpreter (this venv's) with the checkout first on `PYTHONPATH`, and
the two checkouts take turns, so a change of load on the machine hits both alike. It prints the
median, min and max wall time of each (the figures in BENCHMARKS.md, issue 26). ARGS default to
`--help`; give `-- executions list --help` (after `--`) to time a subcommand's help.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def wall_time(tree: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "from toolledger.cli import main; main()", *args],
        env=env,
        cwd="/",
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="The checkout to compare with.")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("args", nargs="*", default=["--help"])
    options = parser.parse_args()
    trees = {"before": options.before.resolve(), "after": HERE}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(options.runs):
        for name, tree in trees.items():
            times[name].append(wall_time(tree, options.args))
    shown = " ".join(["toolledger", *options.args])
    for name, taken in times.items():
        print(
            f"{name:6s} {trees[name]}: {shown}: median {statistics.median(taken):.3f} s "
            f"(min {min(taken):.3f}, max {max(taken):.3f}, n={len(taken)})"
        )


if __name__ == "__main__":
    main()
