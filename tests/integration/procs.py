"""Child processes for multi-process tests: start, watch, signal and always stop them by pid.

Drills that kill, freeze or race real processes (projectors, appenders) need the same few moves:
start `python -m ...` with a `TOOLLEDGER_*` environment, wait until its log says something or a
condition holds (polled with a deadline, never a fixed sleep), send SIGKILL/SIGSTOP/SIGCONT to
exactly that pid, and be sure nothing outlives the test. `Procs` records every process it starts
and `close()` kills each survivor by its pid (never by name: other projectors on the machine are
not ours; SIGKILL ends a stopped process too) and reaps it.

A process's stdout and stderr go to one file, not a pipe, so a chatty child never blocks on a
full pipe while the test is busy, and the whole log is there to read when an assertion fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar, overload

from tests import builders as b
from tests.isolated import child_env
from toolledger.settings import Settings

T = TypeVar("T")

#: The repository root: children run from here so `python -m tests.integration...` resolves.
ROOT = Path(__file__).resolve().parents[2]


@overload
async def until(
    check: Callable[[], Coroutine[Any, Any, T | None]],
    *,
    timeout: float,
    what: str,
    interval: float = ...,
) -> T: ...
@overload
async def until(
    check: Callable[[], T | None], *, timeout: float, what: str, interval: float = ...
) -> T: ...
async def until(
    check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.01
) -> Any:
    """Poll `check` until it returns something truthy and return it; fail after `timeout` s.

    `check` may be a plain or an async function. The assertion names `what` was awaited and the
    last value seen, so a timeout reads as the condition that never held rather than as a hang.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} ({value!r})")
        await asyncio.sleep(interval)


@dataclass
class Proc:
    """One child process and the file its output goes to."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended (negative: killed by that signal)."""
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        """Everything the process printed so far (stdout and stderr interleaved)."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def mark(self) -> int:
        """The current end of the output: pass it to `wait_for(after=...)` to skip older lines."""
        return len(self.output())

    async def wait_for(
        self, pattern: str | re.Pattern[str], *, timeout: float, after: int = 0
    ) -> re.Match[str]:
        """The first match of `pattern` (a regex) in the output from position `after` on.

        Fails early, with the output, if the process exits without printing it.
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern

        def seen() -> re.Match[str] | None:
            found = regex.search(self.output(), after)
            if found is None and not self.alive():
                raise AssertionError(
                    f"{self.name} (pid {self.pid}) exited with {self.returncode} before printing "
                    f"{regex.pattern!r}:\n{self.output()[-4000:]}"
                )
            return found

        return await until(seen, timeout=timeout, what=f"{self.name} to print {regex.pattern!r}")

    async def wait_exit(self, *, timeout: float) -> int:
        """The exit status, once the process has ended.

        A process that does not end in time is sent SIGABRT, which makes Python (started with
        `PYTHONFAULTHANDLER=1`, as `Procs` does) print every thread's stack before dying, and
        the assertion shows that output: a hang reads as where it hung.
        """
        try:
            await until(lambda: not self.alive(), timeout=timeout, what=f"{self.name} to exit")
        except AssertionError as exc:
            self.signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(5)
            raise AssertionError(f"{exc}; its output:\n{self.output()[-6000:]}") from None
        code = self.popen.poll()
        assert code is not None
        return code

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to this pid, unless the process was already reaped (its pid may be reused)."""
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP: the process stays alive, its sockets stay open, it runs nothing."""
        self.signal(signal.SIGSTOP)
        _await_state(self.pid, "T", "t")

    def resume(self) -> None:
        """SIGCONT after `freeze`."""
        self.signal(signal.SIGCONT)

    def kill(self, timeout: float = 10.0) -> int:
        """SIGKILL and reap; returns the exit status."""
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        code = self.popen.wait(timeout)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        self._log.close()
        return code

    def local_ports(self) -> set[int]:
        """Local TCP ports of this process's open sockets (Linux `/proc`).

        Matches `pg_stat_activity.client_port` to tell which server sessions are this process's.
        """
        inodes: set[str] = set()
        fd_dir = Path(f"/proc/{self.pid}/fd")
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        ports: set[int] = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as lines:
                next(lines)
                for line in lines:
                    cols = line.split()
                    if cols[9] in inodes:
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        return ports


def _await_state(pid: int, *states: str, timeout: float = 5.0) -> None:
    """Block until the kernel reports `pid` in one of `states` (e.g. "T": stopped).

    A signal is delivered asynchronously; the callers act on the stopped process right after.
    """
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rpartition(")")[2].split()[0] in states:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} did not reach state {states} in {timeout:g}s")
        time.sleep(0.001)


class Procs:
    """Starts child processes and stops every one of them, by pid, in `close()`."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Proc] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        stdin: int | None = subprocess.DEVNULL,
    ) -> Proc:
        """Start `argv` (run from the repository root) with `env` added to this environment."""
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 -- closed when the process is killed
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **env}
        popen = subprocess.Popen(
            list(argv), cwd=ROOT, env=full_env, stdin=stdin, stdout=log, stderr=subprocess.STDOUT
        )
        proc = Proc(name, popen, log_path, log)
        self.started.append(proc)
        return proc

    def python(
        self, name: str, module: str, *args: str, env: Mapping[str, str], stdin: int | None = None
    ) -> Proc:
        """`python -m module args...` with this interpreter."""
        return self.start(
            name,
            [sys.executable, "-m", module, *args],
            env,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
        )

    def projector(self, name: str, env: Mapping[str, str], *, status_every: float = 0.2) -> Proc:
        """`python -m toolledger projector`, logging what it owns every `status_every` seconds."""
        return self.python(
            name, "toolledger", "projector", "--status-every", str(status_every), env=env
        )

    def close(self) -> None:
        """Kill every process still running (stopped ones included) and reap it."""
        errors: list[str] = []
        for proc in self.started:
            try:
                proc.kill()
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{proc.name} (pid {proc.pid}): {exc}")
        if errors:
            raise RuntimeError("could not stop: " + "; ".join(errors))


@asynccontextmanager
async def python_child(
    *args: str, env: Mapping[str, str], stdout: int = asyncio.subprocess.DEVNULL
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python args...` from the repository root with `env` (stderr piped), stopped by its pid
    afterwards: SIGTERM, and SIGKILL if it has not exited 10 s later."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, env=env, stdout=stdout, stderr=asyncio.subprocess.PIPE
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def run_toolledger(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m toolledger args...` with exactly `env`, its output captured; 60 s at most."""
    return subprocess.run(
        [sys.executable, "-m", "toolledger", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def run_toolledger_async(env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    """`run_toolledger` without blocking the loop: (exit status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "toolledger",
        *args,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def toolledger_env(settings: Settings) -> dict[str, str]:
    """The `TOOLLEDGER_*` variables that point a child at one test's schema and topics."""
    return {
        **child_env(settings),
        # Public: what a projector child verifies operator signatures with.
        "TOOLLEDGER_VERIFY_KEYS": b.SIGNING_KEY.public_setting(),
    }
