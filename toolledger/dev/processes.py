"""A server the dev stack started, and how it is started, probed and stopped: by pid, never by name.

Other brokers and PostgreSQL servers run on the same machine (other checkouts, other test
sessions), so nothing here looks a process up by its name: a `Service` carries the pid of the
process its own `up` started, and a pid counts as ours only while its command line still names
the program we started (a reused pid is somebody else's). Servers run in a session of their own
so they outlive the command that started them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from toolledger.errors import ToolLedgerError

ServiceName = Literal["postgres", "kafka"]
#: Where a service comes from: an env var, a server found running, or one the stack started.
Source = Literal["env", "local", "embedded", "tansu", "apache"]
#: What the command line of a process we started holds, per source.
_PROGRAMS: dict[Source, str] = {"embedded": "postgres", "tansu": "tansu", "apache": "kafka.Kafka"}
_T = TypeVar("_T")
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class DevStackError(ToolLedgerError, RuntimeError):
    """A dev service could not be found, started or stopped; the message says what to do."""

    code = "dev_stack"


class DevStackMissing(DevStackError):
    """Something the dev stack needs is not installed (an extra, `java`, `mvn`): a usage error
    (exit status 2), not an outage; the message names what to install."""

    code = "dev_stack_missing"


@dataclass(frozen=True)
class Service:
    """One service of the stack; `pid` is set only when the dev stack started the process."""

    name: ServiceName
    address: str
    source: Source
    pid: int | None = None
    log: str | None = None

    @property
    def started_by_us(self) -> bool:
        return self.pid is not None

    def is_running(self) -> bool:
        """Whether our process still runs (a service we did not start counts as running)."""
        if self.pid is None:
            return True
        return process_alive(self.pid, _PROGRAMS.get(self.source, self.source))


def spawn(argv: Sequence[str], log: Path, cwd: Path, env: dict[str, str] | None = None) -> int:
    """Start a server in its own session, its output appended to `log`; its pid."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def exited(pid: int) -> bool:
    """Whether a process this process spawned has exited (reaping it if so)."""
    child = _CHILDREN.get(pid)
    return child is not None and child.poll() is not None


def stop(service: Service, grace: float = 10.0) -> None:
    """Stop a service we started: SIGTERM (SIGINT for PostgreSQL), a grace period, SIGKILL."""
    pid = service.pid
    if pid is None or not service.is_running():
        return
    # SIGTERM is PostgreSQL's "smart" shutdown, which waits for every client to disconnect;
    # SIGINT is its fast shutdown, the one that means "stop now, cleanly".
    first = signal.SIGINT if service.name == "postgres" else signal.SIGTERM
    for sig, wait in ((first, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not service.is_running():
                _CHILDREN.pop(pid, None)
                return
            time.sleep(0.05)
    raise DevStackError(f"{service.name} (pid {pid}) survived SIGKILL; stop it by hand")


def process_alive(pid: int, program: str) -> bool:
    """Whether `pid` is a live process running `program` (a reused pid is not ours)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").is_dir():
        with contextlib.suppress(PermissionError):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
        return True
    try:
        stat, cmdline = (proc / "stat").read_text(), (proc / "cmdline").read_bytes()
    except OSError:
        return False
    # A process that exited but was not yet reaped by its parent (or a lazy init) is a zombie.
    state = stat.rpartition(")")[2].split()[0]
    return state not in ("Z", "X") and program.encode() in cmdline


def address_answers(service: Service) -> bool:
    """Whether the service's port accepts a TCP connection."""
    if service.name == "postgres":
        parts = urlsplit(service.address)
        return parts.hostname is not None and tcp_answers(parts.hostname, parts.port or 5432)
    host, _, port = service.address.split(",")[0].rpartition(":")
    return port.isdigit() and tcp_answers(host, int(port))


def tcp_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_broker(
    service: Service,
    timeout: float,
    ready: Callable[[str], Coroutine[Any, Any, bool]],
    pause: float,
) -> bool:
    """Whether `ready(address)` holds for the broker `service` before `timeout`, asked once its
    port answers and every `pause` seconds; False once it exits."""
    assert service.pid is not None
    host, _, port = service.address.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited(service.pid) or not service.is_running():
            return False
        if tcp_answers(host, int(port)) and run_blocking(ready(service.address)):
            return True
        time.sleep(pause)
    return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a probe on a private event loop in a worker thread.

    The dev stack is called from sync code that may sit inside a running loop (pytest-asyncio),
    and `asyncio.run` in the caller's thread would fail there or reset its event loop.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolledger-devstack") as pool:
        return pool.submit(asyncio.run, coro).result()


async def kafka_answers(bootstrap: str, seconds: float) -> bool:
    """Whether a Kafka broker at `bootstrap` describes its cluster within `seconds`."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="toolledger-devstack",
        request_timeout_ms=int(seconds * 1000),
    )
    try:
        # Bounded by the request timeout, never cancelled: aiokafka closes its bootstrap
        # connection when its own timeout fires, but leaks it when cancelled mid-request.
        await admin.start()
        await asyncio.wait_for(admin.describe_cluster(), seconds)
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await admin.close()
    return True
