"""Apache Kafka in the dev stack: one KRaft node (broker and controller in one JVM) on loopback.

This is the broker users run (`docker-compose.yml` names the same version), so it is what `make
test`, the drills and the benchmarks run on. Its jars come from Maven Central
(`toolledger.dev.maven`); the JVM runs them with a config written here for a machine that runs
many short test topics beside other work:

- free loopback ports, remembered in the broker's folder and taken again when still free, so a
  restart keeps its address (clients reconnect) and `dev up` prints the same exports;
- its data under the stack's folder (`.toolledger/kafka/data`): it survives `dev down` and a
  crash, which is what lets a drill SIGKILL it and check that nothing acknowledged was lost;
- `auto.create.topics.enable=false` (toolledger creates its topics with epoch markers, and so
  does every test), replication factor 1 for the internal topics, few partitions for them,
  `group.initial.rebalance.delay.ms=0` (a consumer group of one joins at once), a small heap
  and few threads.

Storage is formatted once (a new cluster id); the broker is ready when a produce with acks=all
to a probe topic is acknowledged, not merely when its port answers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import uuid
from importlib import resources
from pathlib import Path

from toolledger.dev.maven import KAFKA_VERSION, Progress, kafka_classpath
from toolledger.dev.processes import (
    DevStackError,
    DevStackMissing,
    Service,
    free_port,
    port_free,
    spawn,
    stop,
    tail,
    wait_for_broker,
)

PROBE_TOPIC = "toolledger-devstack-probe"
#: The heap and collector of the broker's JVM (Kafka's own start script uses G1 too).
_JVM_OPTIONS = [
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]
#: Formatting is a short tool run: the quickest JVM start is the one to take.
_TOOL_OPTIONS = ["-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def start_apache_kafka(
    home: Path,
    timeout: float = 60.0,
    *,
    port: int | None = None,
    progress: Progress | None = None,
) -> Service:
    """Start (or restart, on the data it kept) the Apache Kafka broker whose files live in
    `home/kafka`; the caller stops it by pid. `port` pins the client port, else the one it had
    last time if free, else a free one. Returns once a produce with acks=all is acknowledged."""
    java = java_binary()
    classpath = os.pathsep.join(str(jar) for jar in kafka_classpath(progress))
    folder = home / "kafka"
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    log = home / "kafka.log"
    broker_port, controller_port = _ports(folder, port)
    props = folder / "server.properties"
    props.write_text(server_properties(data, broker_port, controller_port))
    log4j = folder / "log4j.properties"
    log4j.write_text(
        resources.files("toolledger.dev").joinpath("kafka-log4j.properties").read_text()
    )
    logging = f"-Dlog4j.configuration=file:{log4j}"
    if not (data / "meta.properties").exists():
        _format(java, classpath, logging, props, log)
    argv = [java, *_JVM_OPTIONS, logging, "-cp", classpath, "kafka.Kafka", str(props)]
    bootstrap = f"127.0.0.1:{broker_port}"
    service = Service("kafka", bootstrap, "apache", spawn(argv, log, folder), str(log))
    if progress is not None:
        progress(f"Apache Kafka {KAFKA_VERSION} starting on {bootstrap} (pid {service.pid})")
    if wait_until_acknowledged(service, timeout):
        return service
    if service.is_running():
        stop(service)
        raise DevStackError(
            f"Apache Kafka on {bootstrap} did not acknowledge a produce within {timeout:.0f}s; "
            f"stopped it. Its log ({log}) ends with:\n{tail(log)}"
        )
    raise DevStackError(f"Apache Kafka exited on start. Its log ({log}) ends with:\n{tail(log)}")


def java_binary() -> str:
    """The `java` to run the broker with: $JAVA_HOME's, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (candidate := Path(java_home) / "bin" / "java").is_file():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise DevStackMissing(
            "Apache Kafka needs a Java runtime (17 or later), and `java` is not on PATH nor in "
            "$JAVA_HOME. Install one (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`; "
            "macOS: `brew install openjdk@17`), or use the quick local broker: "
            "`toolledger dev up --kafka tansu`."
        )
    return found


def server_properties(data: Path, broker_port: int, controller_port: int) -> str:
    """The single-node KRaft config (module docstring)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        # After a crash the controller waits out the dead incarnation's session before the
        # restarted broker may register: 9 s by default, half a second of heartbeats here.
        "broker.session.timeout.ms": "2500",
        "broker.heartbeat.interval.ms": "500",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "num.replica.fetchers": "1",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def wait_until_acknowledged(service: Service, timeout: float) -> bool:
    """Whether the broker acknowledges a produce (acks=all) before `timeout`; False once it
    exits. Its port answers seconds before it can take a write."""
    return wait_for_broker(service, timeout, lambda address: _acknowledges(address, 5.0), 0.2)


async def _acknowledges(bootstrap: str, seconds: float) -> bool:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    bound = int(seconds * 1000)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=bound)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", request_timeout_ms=bound, linger_ms=0
    )
    try:
        # Bounded by the clients' own timeouts, never cancelled (a cancelled start leaks its
        # bootstrap connection: toolledger.dev.processes.kafka_answers).
        await admin.start()
        if PROBE_TOPIC not in await admin.list_topics():
            with contextlib.suppress(TopicAlreadyExistsError):
                await asyncio.wait_for(admin.create_topics([NewTopic(PROBE_TOPIC, 1, 1)]), seconds)
        await producer.start()
        await asyncio.wait_for(producer.send_and_wait(PROBE_TOPIC, b"ready"), seconds)
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await producer.stop()
        await admin.close()
    return True


def _ports(folder: Path, port: int | None) -> tuple[int, int]:
    """The client and controller ports: as asked, else as last time if free, else free ones."""
    remembered = folder / "ports.json"
    try:
        last = json.loads(remembered.read_text())
        previous = (int(last["broker"]), int(last["controller"]))
    except (OSError, ValueError, KeyError, TypeError):
        previous = None
    broker = port or (previous[0] if previous and port_free(previous[0]) else free_port())
    controller = previous[1] if previous and port_free(previous[1]) else free_port()
    while controller == broker:
        controller = free_port()
    remembered.write_text(json.dumps({"broker": broker, "controller": controller}) + "\n")
    return broker, controller


def _format(java: str, classpath: str, logging: str, props: Path, log: Path) -> None:
    """Format the storage of a new node: a fresh cluster id, Kafka's own tool."""
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    argv = [java, *_TOOL_OPTIONS, logging, "-cp", classpath, "kafka.tools.StorageTool"]
    argv += ["format", "--ignore-formatted", "-t", cluster_id, "-c", str(props)]
    with log.open("ab") as out:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=120
        )
    if done.returncode != 0:
        raise DevStackError(
            f"formatting Apache Kafka's storage ({props.parent}) failed "
            f"(exit status {done.returncode}); its log ({log}) ends with:\n{tail(log)}"
        )
