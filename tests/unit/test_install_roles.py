"""Installs by role (issue 26): `pip install toolledger` is a runtime's install, and the server
roles' frameworks are the `server` extra. What runs without the extra must run, and what needs
it must say which extra to install."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("faust-streaming", "fastapi", "uvicorn", "jinja2", "python-multipart")


def _runtime_only(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.runtime_only", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "160"},
    )


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for r in requirements}


def test_the_base_install_holds_no_server_framework_and_the_server_extra_holds_them_all() -> None:
    """A runtime installed 143 MB of faust, FastAPI and uvicorn it never imports."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not _names(project["dependencies"]) & set(SERVER_ONLY)
    assert set(SERVER_ONLY) <= _names(project["optional-dependencies"]["server"])
    assert any("server" in r for r in project["optional-dependencies"]["test"])


def test_the_demo_runs_on_a_runtime_only_install() -> None:
    """After a plain `pip install -e .` the demo said httpx was missing and advised exactly the
    install just done; it must run, with the operator acting through the operator service."""
    shown = _runtime_only("demo")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert "scenario 2: failed/operator alice" in lines
    assert "scenario 3: compensated/asked for by operator alice" in lines
    assert "resolve demo-run:credit-2 (the operator service) -> failed" in shown.stdout


@pytest.mark.parametrize("command", [["server"], ["api"], ["reconciler", "--tools", "x"]])
def test_a_server_role_without_the_server_extra_names_the_extra_to_install(
    command: list[str],
) -> None:
    """Without the extra a role must stop with exit 2 and the pip command, not a traceback
    about a module the user never heard of."""
    shown = _runtime_only(*command)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "pip install 'toolledger[server]'" in shown.stderr
    assert "Traceback" not in shown.stderr


def test_the_api_package_names_the_extra_when_create_app_is_asked_for() -> None:
    script = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from toolledger.extras import MissingExtra\n"
        "try:\n    from toolledger.api import create_app\n"
        "except MissingExtra as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "pip install 'toolledger[server]'" in done.stdout, done.stderr


def test_the_wheel_installs_one_top_level_package() -> None:
    """The install put a top-level `examples` package into site-packages, where it shadowed a
    user's own `examples`. Of the checkout's top-level packages, pyproject's find patterns
    (fnmatch on the package name, as setuptools applies them) must take `toolledger` alone."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    config = found["packages"]["find"]
    candidates = [d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()]
    packaged = {
        name
        for name in candidates
        if any(fnmatch.fnmatchcase(name, p) for p in config.get("include", ["*"]))
        and not any(fnmatch.fnmatchcase(name, p) for p in config.get("exclude", []))
    }
    assert packaged == {"toolledger"}, packaged
    assert (ROOT / "toolledger" / "examples" / "billing_reconciliation" / "__init__.py").is_file()
