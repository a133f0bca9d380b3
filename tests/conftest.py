"""Session services and per-test isolation (schemas, topic names).

Tests that need PostgreSQL or Kafka get the real services, found the way `toolledger dev up`
finds them (`toolledger.devstack`): the `TOOLLEDGER_*` env vars, else the live stack recorded in
the project's `.toolledger/state.json` (what `make test` brings up), else a stack this pytest
session starts and stops itself. A service that cannot be started fails the run; nothing here
skips. Each test then gets its own PostgreSQL schema and its own topic-name prefix, so tests
sharing one server never see each other's rows or records.

The fixture names and types below are the contract the rest of the suite relies on.

The suite does not read the caller's ledger settings: a shell that exported what `toolledger dev
up` prints (`TOOLLEDGER_VERIFY_KEYS`, `TOOLLEDGER_SIGNING_KEYS`, ...) would otherwise reach every
settings object a test builds and every child it starts. From configuration on, every
`TOOLLEDGER_*` variable is removed except the services' addresses and the suite's own knobs
(`_CALLER_ENV`); tests that need one set it themselves.

Long persistence drills (`@pytest.mark.drill`, e.g. the 1000-run drill) run only with
`--drills`; the CI drill in `tests/drills` is not marked and always runs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import uuid
import warnings
from asyncio import selector_events
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import hypothesis
import pytest

from tests import tracing_support
from tests.isolated import Isolated
from toolledger.devstack import (
    DATABASE_URL_ENV,
    DEV_KAFKA_ENV,
    KAFKA_BOOTSTRAP_ENV,
    STATE_DIR,
    DevStack,
    KafkaKind,
    Services,
    delete_topics,
    dev_kafka_choice,
    resolve_services,
)

_SESSIONS_DIR = Path(STATE_DIR) / "sessions"
#: The `TOOLLEDGER_*` variables the suite takes from its caller: where the services are
#: (`dev_services`), the drills' seed and where the console test copies its screenshots.
_CALLER_ENV = frozenset(
    {DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV, "TOOLLEDGER_DRILL_SEED", "TOOLLEDGER_SCREENSHOTS"}
)
_clean_env = pytest.MonkeyPatch()

# No property test here is about speed (the codec, schema evolution and the decider's state
# machine check what comes out, not how fast), and hypothesis' 200 ms per-example deadline
# measures the machine: on two cores shared by other test runs a first example that builds
# the codec overran it. Speed is measured by the benchmarks, never by a deadline here.
hypothesis.settings.register_profile("toolledger", deadline=None)
hypothesis.settings.load_profile("toolledger")


#: The broker this session's tests run on (`TOOLLEDGER_DEV_KAFKA`, which `make test` sets per
#: lane): a live stack of another kind is not used; the session starts its own.
_LANE: dict[str, KafkaKind | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Remove the caller's other `TOOLLEDGER_*` variables before anything is collected, and
    make SIGTERM stop the run the way Ctrl-C does."""
    _LANE["kafka"] = dev_kafka_choice(os.environ.get(DEV_KAFKA_ENV) or None)
    for name in list(os.environ):
        if name.startswith("TOOLLEDGER_") and name not in _CALLER_ENV:
            _clean_env.delenv(name)
    signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum: int, frame: object) -> None:
    """SIGTERM's default ends pytest on the spot: no fixture is torn down, so the processes
    tests started (projectors, workers, brokers) outlive it and keep polling. As a
    KeyboardInterrupt, pytest stops, and every fixture stops what it started by pid."""
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_unconfigure(config: pytest.Config) -> None:
    _clean_env.undo()


@pytest.fixture
def spans() -> Iterator[tracing_support.Spans]:
    """An OpenTelemetry SDK recording into memory for this test (`tests.tracing_support`)."""
    recorded = tracing_support.listen()
    yield recorded
    tracing_support.stop()


#: The broker's address once this session has resolved it (`_aiokafka_shutdown_race`).
_BROKER: dict[str, str] = {}


@pytest.fixture(scope="session")
def dev_services(request: pytest.FixtureRequest) -> Iterator[Services]:
    """The services of this test session, started here only when nothing else provides them."""
    root = request.config.rootpath
    wanted = _LANE.get("kafka")
    found = resolve_services(root)
    live_kind = DevStack(root).kafka_kind()
    if found is not None and (
        wanted is None or KAFKA_BOOTSTRAP_ENV in os.environ or live_kind == wanted
    ):
        _BROKER["address"] = found.kafka_bootstrap
        _BROKER["kind"] = live_kind or "env"
        yield found
        return
    _stop_abandoned_session_stacks(root / _SESSIONS_DIR)
    stack = DevStack(root / _SESSIONS_DIR / str(os.getpid()), kafka=wanted)
    if found is not None:
        # The live stack runs another broker: this session brings its own, beside the live
        # PostgreSQL, and points every child it starts at it.
        _clean_env.setenv(DATABASE_URL_ENV, found.database_url)
    try:
        services = stack.up()
        _BROKER["address"] = services.kafka_bootstrap
        _BROKER["kind"] = stack.kafka_kind() or "env"
        if found is not None:
            _clean_env.setenv(KAFKA_BOOTSTRAP_ENV, services.kafka_bootstrap)
        yield services
    finally:
        stack.down()
        shutil.rmtree(stack.project_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def broker_kind(dev_services: Services) -> str:
    """The session's broker: `apache`, `tansu`, or `env` (one named by TOOLLEDGER_KAFKA_BOOTSTRAP,
    of unknown kind). For a test whose expectation differs by broker, which is rare: mark it
    `both_brokers` to have it run in `make test`'s tansu lane too."""
    return _BROKER["kind"]


def _to_session_broker(transport: object) -> bool:
    """Whether `transport` is connected to this session's broker (`_BROKER`)."""
    address = _BROKER.get("address")
    extra = getattr(transport, "_extra", None)
    peer = extra.get("peername") if isinstance(extra, dict) else None
    if address is None or not isinstance(peer, tuple) or len(peer) < 2:
        return False
    host, _, port = address.rpartition(":")
    return (str(peer[0]), str(peer[1])) == (host, port)


#: asyncio's base of socket transports (private, so not in the type stubs).
_SelectorTransport: Any = vars(selector_events)["_SelectorTransport"]


def _quiet_for_the_broker(self: Any, _warn: Any = warnings.warn) -> None:
    """`_SelectorTransport.__del__`, told which peer a leaked transport was connected to.

    A connection lost to aiokafka's shutdown race (`_aiokafka_shutdown_race`) and collected
    after its test's loop closed warns three times, in whatever order the collector finalizes
    its objects: the `AIOKafkaConnection`, its socket (both ignored there, for the broker only)
    and its transport, whose own warning ("unclosed transport <_SelectorSocketTransport fd=N>")
    names no address for a warning filter to match. So the peer is looked up here: a transport
    to this session's broker has its socket closed quietly; any other (PostgreSQL, a leader, a
    test server) warns as asyncio does, with the peer named so the leak can be traced, and
    fails the test it is collected in."""
    sock = getattr(self, "_sock", None)
    if sock is None:
        return
    if not _to_session_broker(self):
        peer = self._extra.get("peername")
        _warn(f"unclosed transport {self!r} to {peer}", ResourceWarning, source=self)
    sock.close()
    self._sock = None


_SelectorTransport.__del__ = _quiet_for_the_broker


@pytest.fixture(autouse=True)
def _aiokafka_shutdown_race() -> None:
    """aiokafka's `AIOKafkaClient.close()` closes the connections it holds, but not one that a
    task (its own sender or fetcher, a metadata refresh) is still opening under
    `_get_conn_lock`: that connection lands in the client after close, is never closed, and warns
    when it is collected, in whichever later test that happens ("Unclosed AIOKafkaConnection",
    or its socket, to the broker). It is the library's race on shutdown, not a leak of ours, so
    those two warnings are ignored, for connections to this session's broker only: a socket left
    open to anything else (PostgreSQL, a leader, a test server) still fails the test."""
    warnings.filterwarnings(
        "ignore", message="Unclosed AIOKafkaConnection", category=ResourceWarning
    )
    address = _BROKER.get("address")
    if address is not None:
        host, _, port = address.rpartition(":")
        raddr = rf"raddr=\('{re.escape(host)}', {port}\)>"
        warnings.filterwarnings(
            "ignore", message=rf"unclosed <socket\.socket .*{raddr}", category=ResourceWarning
        )


@pytest.fixture(scope="session")
def pg_dsn(dev_services: Services) -> str:
    return dev_services.database_url


@pytest.fixture(scope="session")
def kafka_bootstrap(dev_services: Services) -> str:
    return dev_services.kafka_bootstrap


@pytest.fixture
async def pg_schema(pg_dsn: str) -> AsyncIterator[str]:
    """A fresh schema for this test, dropped with everything in it afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
    finally:
        await conn.close()
    yield name
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def replicas(pg_dsn: str) -> AsyncIterator[list[str]]:
    """Schemas a test replays into (it appends their names); dropped afterwards."""
    made: list[str] = []
    yield made
    conn = await asyncpg.connect(pg_dsn)
    try:
        for schema in made:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
def topic_prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique prefix for this test's topic names; its topics are deleted afterwards.

    Deletion is best effort and happens only when the test uses Kafka at all, so tests that
    only need unique names do not start a broker.
    """
    prefix = f"t{uuid.uuid4().hex[:12]}"
    yield prefix
    if "kafka_bootstrap" in request.fixturenames:
        bootstrap: str = request.getfixturevalue("kafka_bootstrap")
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, _delete_topics(bootstrap, prefix)).result()


@pytest.fixture
def isolated(pg_dsn: str, kafka_bootstrap: str, pg_schema: str, topic_prefix: str) -> Isolated:
    """This test's schema and topic prefix on the session's services (`tests.isolated`)."""
    return Isolated(pg_dsn, kafka_bootstrap, pg_schema, f"{topic_prefix}.")


async def _delete_topics(bootstrap: str, prefix: str) -> None:
    await delete_topics(bootstrap, prefix)


def _stop_abandoned_session_stacks(sessions: Path) -> None:
    """Stop stacks left by pytest sessions that were killed before their teardown ran."""
    if not sessions.is_dir():
        return
    for home in sessions.iterdir():
        if not home.name.isdigit() or _pid_exists(int(home.name)):
            continue
        DevStack(home).down()
        shutil.rmtree(home, ignore_errors=True)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--drills",
        action="store_true",
        default=False,
        help="also run the long persistence drills (marked `drill`); the CI drill always runs",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The contract suite runs on both brokers (`make test`'s tansu lane selects `-m
    both_brokers`), and long drills (`@pytest.mark.drill`) take many minutes: they run only
    with --drills."""
    contract = Path(__file__).parent / "contract"
    for item in items:
        if contract in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.both_brokers)
    if config.getoption("--drills"):
        return
    skip = pytest.mark.skip(reason="a long persistence drill: run it with --drills")
    for item in items:
        if item.get_closest_marker("drill") is not None:
            item.add_marker(skip)
