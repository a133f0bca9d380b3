"""The README's "With your agent framework" snippets run as printed, offline, and make the call
under the key the README says (`order-7:c1`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _snippets() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## With your agent framework")
    end = readme.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", readme[start:end], re.S)


@pytest.mark.parametrize("index", range(3), ids=["langgraph", "pydantic_ai", "openai_agents"])
def test_the_snippet_runs_and_keys_the_call_by_the_frameworks_id(
    index: int, tmp_path: Path
) -> None:
    snippets = _snippets()
    assert len(snippets) == 3
    script = tmp_path / "snippet.py"
    script.write_text(snippets[index])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    shown = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "credited 2500 to acct-7 under order-7:c1" in shown.stdout
