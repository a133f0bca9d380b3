"""Where the peers are installed, free ports, and their processes: started and stopped by pid.

`make bench-peers` installs the peers under `.toolledger/peers/` (a virtualenv of their own, so
their pins never touch toolledger's, and the Restate server from npm). Every process started
here runs in a session of its own with its output in a log file, and is stopped by its pid:
SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = Path(os.environ.get("TOOLLEDGER_PEERS_HOME", ROOT / ".toolledger" / "peers"))
PYTHON = HOME / "venv" / "bin" / "python"
RESTATE_SERVER = (
    HOME / "node_modules" / "@restatedev" / "restate-server-linux-x64" / "bin" / "restate-server"
)


def installed() -> str | None:
    """What is missing, in a sentence, or None when both peers are installed."""
    missing = [str(p) for p in (PYTHON, RESTATE_SERVER) if not p.exists()]
    if missing:
        return f"the peers are not installed ({', '.join(missing)} missing): run `make bench-peers`"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start(
    argv: Sequence[str], log: Path, env: dict[str, str] | None = None, *, pipes: bool = False
) -> asyncio.subprocess.Process:
    """`argv` in a session of its own, output appended to `log` (stdout piped if `pipes`)."""
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if pipes else out,
            stderr=out,
            start_new_session=True,
        )


async def stop(proc: asyncio.subprocess.Process, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; this process only, by pid."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 5)


async def until_listening(port: int, proc: asyncio.subprocess.Process, what: str) -> None:
    """Wait (up to a minute) until something accepts connections on `port`."""
    for _ in range(600):
        if proc.returncode is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within a minute")
