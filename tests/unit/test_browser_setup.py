"""The browser tests' setup: find Debian's Chromium, install it as root, or say what to install.

This machine has Chromium, a clean CI machine may not, so the branches that only a clean
machine takes are exercised here with a binary path that does not exist and apt-get recorded
instead of run (running it for real would change the machine the suite runs on).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import browser


def test_a_missing_chromium_without_root_fails_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "chromium")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y chromium"):
        browser.chromium_path()


def test_as_root_a_missing_chromium_is_installed_refreshing_the_lists_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean machine's first `apt-get install` fails (no package lists yet): the setup must
    run `apt-get update` and install again, and then find the binary."""
    binary = tmp_path / "chromium"
    ran: list[list[str]] = []

    def apt(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess[bytes]:
        ran.append(argv)
        installed = argv[:2] == ["apt-get", "install"] and len(ran) == 3
        if installed:
            binary.write_text("#!/bin/sh\n")
        return subprocess.CompletedProcess(argv, 0 if installed or argv[1] == "update" else 100)

    monkeypatch.setattr(browser, "CHROMIUM", binary)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(subprocess, "run", apt)
    assert browser.chromium_path() == str(binary)
    assert ran == [
        ["apt-get", "install", "-y", "chromium"],
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "chromium"],
    ]


def test_the_installed_chromium_is_found_where_debian_puts_it() -> None:
    assert browser.chromium_path() == "/usr/bin/chromium"
