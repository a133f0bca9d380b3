"""The README's "HTTP tools" block runs as printed, from a file (the tool declaration reads its
source to see that it passes its key), and makes one refund through a dropped connection."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _block() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## HTTP tools")
    end = readme.index("\n## ", start + 1)
    blocks: list[str] = re.findall(r"```python\n(.*?)```", readme[start:end], re.S)
    assert len(blocks) == 1
    return blocks[0]


def _run(*argv: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    if path is not None:
        env["PYTHONPATH"] = path
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_http_block_runs_and_the_model_hears_the_first_answer(tmp_path: Path) -> None:
    """A README example that stopped at its own declaration (its source unreadable) once
    slipped past `python -c`; from a file it must run to one refund."""
    script = tmp_path / "http_tools_readme.py"
    script.write_text(_block())
    shown = _run(str(script), path=str(ROOT))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.splitlines() == [
        "unknown: r1:c1",
        "the model hears: id='re_1' amount=2500",
    ]


def test_the_example_makes_one_refund() -> None:
    """`python -m toolledger.examples.http_refund.refund` as its docstring says: unknown, then the
    replayed first answer, one refund for two requests."""
    shown = _run("-m", "toolledger.examples.http_refund.refund")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("unknown: r1:c1")
    assert "re_1" in lines[1] and "replayed=True" in lines[1]
    assert lines[2] == "refunds made: 1; requests: 2"
