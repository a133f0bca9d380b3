"""What `import toolledger` costs, against a git revision of the package, side by side.

    python -m benchmarks.import_time [--repeat 9] [--baseline REV]

A runtime pays the import once per process, but a CLI command, a test worker and every
framework process pay it on each start. Each child is a fresh interpreter that imports
`toolledger` and then makes and closes an embedded ledger (`Ledger.memory()`), so what the
embedded default loads lazily counts too; the CPU time of both is the child's figure. With
`--baseline REV` the children alternate between `REV`'s package and this tree's
(`benchmarks._baseline`), and the medians and their ratio are printed; without it, this
tree's median alone.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from benchmarks._baseline import add_arguments, child_output, compare


def _child() -> tuple[float, float]:
    """(CPU seconds of `import toolledger` + one embedded ledger, of the import alone)."""
    start = time.process_time()
    import toolledger

    imported = time.process_time() - start

    async def embedded() -> None:
        ledger = await toolledger.Ledger.memory()
        await ledger.close()

    asyncio.run(embedded())
    return time.process_time() - start, imported


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.import_time", description=__doc__)
    add_arguments(parser)
    parser.set_defaults(repeat=9)
    args = parser.parse_args(argv)
    if args.child:
        print(child_output(*_child()))
    elif args.baseline:
        compare(
            "benchmarks.import_time",
            1,
            args.baseline,
            args.repeat,
            "import toolledger + Ledger.memory(), CPU (floor column: the import alone)",
        )
    else:
        runs = [
            subprocess.run(
                [sys.executable, "-m", "benchmarks.import_time", "--child", "1"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for _ in range(args.repeat)
        ]
        import json

        cpu = statistics.median(json.loads(r.strip().splitlines()[-1])["cpu_us"] for r in runs)
        print(f"import toolledger + Ledger.memory(): {cpu / 1000:.0f} ms CPU (median)")


if __name__ == "__main__":
    main()
