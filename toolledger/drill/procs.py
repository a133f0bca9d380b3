"""The drill's child processes: started with a `TOOLLEDGER_*` environment, signalled by pid.

The same few moves as the multi-process tests (`tests/integration/procs.py`), for a product
command that cannot import the test tree: start `python -m ...`, send SIGKILL/SIGSTOP/SIGCONT
to exactly that pid (never by name: other projectors on the machine are not the drill's), and
make sure nothing outlives the drill (`Procs.close()` kills and reaps every survivor). Output
goes to a file per process, so a chatty child never blocks on a full pipe and its whole log is
there to read when a check fails.

Runtime workers are started by `Procs.fork`, from a fork server that imported the worker's
modules once (`multiprocessing`'s "forkserver"): a drill starts a new worker for every kill,
and on a two-core machine importing toolledger afresh each time would cost more CPU than the
drill itself. Each child is still a new process with its own pid, connections and state.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

#: What the fork server imports once, so that forked workers start without importing anything.
#: "__main__" too: without it every child would re-import the parent's main script (the
#: `toolledger` console script, hence the whole CLI) from disk.
_PRELOAD = ["__main__", "toolledger.drill.worker"]


class _Handle(Protocol):
    """The part of `subprocess.Popen` a `Proc` uses; `_Forked` gives a forked child the same."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class _Forked:
    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        code = self.process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        return code


def _forked_main(
    target: Callable[..., None], args: tuple[Any, ...], env: Mapping[str, str], log_path: str
) -> None:
    """The first thing a forked child runs: its environment and its own log file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    faulthandler.enable()
    os.environ.update(env)
    target(*args)


@dataclass
class Proc:
    """One child process and the file its output goes to."""

    name: str
    popen: _Handle
    log_path: Path
    started: float
    _log: IO[bytes] | None = field(repr=False, default=None)

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
        """Everything the process printed so far ("" if it died before opening its log)."""
        if self._log is not None:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to this pid, unless the process was already reaped (its pid may be reused)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP, and wait until the kernel reports the process stopped."""
        self.signal(signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.alive():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{self.pid}/stat").read_text()
                if stat.rpartition(")")[2].split()[0] in ("T", "t"):
                    return
            time.sleep(0.001)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self, timeout: float = 10.0) -> int:
        """SIGKILL and reap; returns the exit status."""
        self.signal(signal.SIGKILL)
        code = self.popen.wait(timeout)
        self._close()
        return code

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`; returns the status."""
        self.signal(signal.SIGTERM)
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        self._close()
        return code

    def local_ports(self) -> set[int]:
        """Local TCP ports of this process's sockets (Linux `/proc`): matched against
        `pg_stat_activity.client_port` to tell which server sessions are this process's."""
        inodes: set[str] = set()
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{self.pid}/fd").iterdir():
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


class Procs:
    """Starts child processes and stops every one of them, by pid, in `close()`."""

    def __init__(self, log_dir: Path, env: Mapping[str, str]) -> None:
        self.log_dir = log_dir
        self.env = dict(env)
        self.started: list[Proc] = []
        self._forks: multiprocessing.context.ForkServerContext | None = None

    def fork(self, name: str, target: Callable[..., None], *args: Any) -> Proc:
        """`target(*args)` in a new process forked from the fork server, with the drill's
        environment and its output in `<name>.log`."""
        if self._forks is None:
            self._forks = multiprocessing.get_context("forkserver")
            self._forks.set_forkserver_preload(_PRELOAD)
        log_path = self.log_dir / f"{name}.log"
        process = self._forks.Process(
            target=_forked_main,
            args=(target, args, dict(self.env), str(log_path)),
            name=name,
            daemon=False,
        )
        process.start()
        proc = Proc(name, _Forked(process), log_path, time.monotonic())
        self.started.append(proc)
        return proc

    def python(self, name: str, module: str, *args: str) -> Proc:
        """`python -m module args...` with this interpreter and the drill's environment."""
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 -- closed when the process is reaped
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **self.env}
        argv: Sequence[str] = [sys.executable, "-m", module, *args]
        popen = subprocess.Popen(
            list(argv), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        proc = Proc(name, popen, log_path, time.monotonic(), log)
        self.started.append(proc)
        return proc

    def reap(self) -> None:
        """Forget processes that ended (their log files are closed)."""
        for proc in [p for p in self.started if not p.alive()]:
            proc._close()
            self.started.remove(proc)

    def close(self) -> None:
        """Kill every process still running (stopped ones included) and reap it."""
        for proc in self.started:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                proc.kill()
        self.started.clear()
