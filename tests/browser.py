"""A real browser for the console tests: Debian's Chromium driven by Playwright, and a server.

Playwright comes from PyPI; the browser is the `chromium` Debian package at /usr/bin/chromium,
never one `playwright install` downloads (that needs network access to Playwright's CDN, and
CI installs system packages instead). When the binary is missing and the tests run as root,
`chromium_path()` installs the package with apt-get (refreshing the package lists if the first
try fails); otherwise it fails the test naming what to install. Nothing here skips.

`serve()` runs an ASGI app with uvicorn on a socket bound to a free loopback port, in the
test's own event loop, and stops it when the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_INSTALL = ["apt-get", "install", "-y", "chromium"]


def chromium_path() -> str:
    """/usr/bin/chromium, installed first when it is missing and we may (see the docstring)."""
    if CHROMIUM.exists():
        return str(CHROMIUM)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(
            f"the console's browser tests drive Debian's Chromium at {CHROMIUM}, which is "
            "missing: install the `chromium` package (`sudo apt-get install -y chromium`); "
            "do not use `playwright install`"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(_INSTALL, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(_INSTALL, env=env, check=True)
    if not CHROMIUM.exists():
        pytest.fail(f"`apt-get install -y chromium` finished but {CHROMIUM} is still missing")
    return str(CHROMIUM)


@contextlib.asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` on a free loopback port for the block; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="console-test-server")
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
