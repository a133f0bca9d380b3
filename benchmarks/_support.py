"""What every benchmark shares: services, scratch schemas and topics, statistics, the table.

The machine these run on is small (2 cores), shared and noisy, so a figure on its own means
little. Each benchmark measures a floor in the same run, right next to its own measurement, and
reports the ratio; every figure is the median over repetitions. Everything a benchmark creates
(schemas, topics, processes) is removed by pid or by name when it ends, even on an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from toolledger.devstack import DevStack, KafkaKind, Services
from toolledger.events.signing import SigningKey
from toolledger.settings import ProjectorSettings

#: The benchmarks' operator key (public half for projectors; nothing here signs by default).
BENCH_KEY = SigningKey.generate("bench")


@dataclass(frozen=True)
class Row:
    """One line of the results table: a measured value, its floor and the goal it is held to."""

    benchmark: str
    metric: str
    value: float
    unit: str
    floor: float | None = None
    floor_name: str = ""
    goal: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.floor is None or self.floor == 0:
            return None
        return self.value / self.floor


@contextlib.contextmanager
def services(kafka: KafkaKind | None = None) -> Iterator[Services]:
    """PostgreSQL and Kafka as the dev stack finds them; a broker started here is stopped here.

    `TOOLLEDGER_DATABASE_URL` / `TOOLLEDGER_KAFKA_BOOTSTRAP` win when set; otherwise the
    benchmarks start their own broker of the kind asked for (`kafka`: Apache Kafka or tansu;
    None: tansu), by pid, in a temporary directory, so they never share a broker with tests or
    another run.
    """
    home = Path(tempfile.mkdtemp(prefix="toolledger-bench-"))
    stack = DevStack(home, kafka=kafka, startup_timeout=120.0)
    try:
        yield stack.up()
    finally:
        try:
            stack.down()
        finally:
            shutil.rmtree(home, ignore_errors=True)


class Scratch:
    """Schemas and topics made for one benchmark run, dropped by `cleanup`."""

    def __init__(self, found: Services) -> None:
        self.services = found
        self.prefix = f"bench{uuid.uuid4().hex[:8]}."
        self._schemas: list[str] = []

    def schema(self, label: str) -> str:
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        self._schemas.append(name)
        return name

    def topics(self, label: str) -> str:
        """A topic prefix of this run for one benchmark (`<prefix><label>.`): deleted at the end."""
        return f"{self.prefix}{label}."

    def settings(self, schema: str, topics: str, **overrides: object) -> ProjectorSettings:
        values: dict[str, object] = {
            "database_url": self.services.database_url,
            "kafka_bootstrap": self.services.kafka_bootstrap,
            "schema_name": schema,
            "topic_prefix": topics,
            "verify_keys": BENCH_KEY.verify_keys(),
            **overrides,
        }
        return ProjectorSettings(**values)  # type: ignore[arg-type]

    def env(self, schema: str, topics: str, **overrides: object) -> dict[str, str]:
        """The same settings as `TOOLLEDGER_*` variables, for a projector process."""
        values: dict[str, object] = {
            "TOOLLEDGER_DATABASE_URL": self.services.database_url,
            "TOOLLEDGER_KAFKA_BOOTSTRAP": self.services.kafka_bootstrap,
            "TOOLLEDGER_SCHEMA": schema,
            "TOOLLEDGER_TOPIC_PREFIX": topics,
            "TOOLLEDGER_VERIFY_KEYS": BENCH_KEY.public_setting(),
        }
        values.update({f"TOOLLEDGER_{k.upper()}": v for k, v in overrides.items()})
        return {k: str(v) for k, v in values.items()}

    async def drop_schema(self, name: str) -> None:
        conn = await asyncpg.connect(self.services.database_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()

    async def delete_topics(self, *names: str) -> None:
        """Delete these topics (all of this run's topics when none are named)."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.services.kafka_bootstrap, request_timeout_ms=10_000
        )
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            wanted = set(names) if names else {t for t in existing if t.startswith(self.prefix)}
            if wanted & existing:
                await admin.delete_topics(sorted(wanted & existing))
        finally:
            await admin.close()

    async def cleanup(self) -> None:
        problems: list[str] = []
        for name in self._schemas:
            try:
                await self.drop_schema(name)
            except (OSError, asyncpg.PostgresError) as exc:
                problems.append(f"schema {name}: {exc}")
        try:
            await self.delete_topics()
        except Exception as exc:  # report and go on: cleanup must not hide the results
            problems.append(f"topics {self.prefix}*: {exc!r}")
        for problem in problems:
            print(f"cleanup failed: {problem}", file=sys.stderr)


async def start_process(
    argv: Sequence[str], env: dict[str, str], log: Path
) -> asyncio.subprocess.Process:
    """`python <argv>` in a session of its own, output appended to `log`; stop it with
    `stop_process` (by pid)."""
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            *argv,
            env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM (a projector stops cleanly on it), then SIGKILL; this process only, by pid."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 5)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values`."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def say(message: str) -> None:
    """Progress on stderr, so stdout stays the results table."""
    print(message, file=sys.stderr, flush=True)


def table(rows: Sequence[Row]) -> str:
    """The results as a plain text table (readable in CI logs, pasteable into markdown)."""
    header = ("benchmark", "metric", "value", "floor", "ratio", "goal")
    lines = [header]
    for r in rows:
        floor = "" if r.floor is None else f"{_num(r.floor)} {r.unit} ({r.floor_name})"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append((r.benchmark, r.metric, f"{_num(r.value)} {r.unit}", floor, ratio, r.goal))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    notes = [f"  {r.benchmark} / {r.metric}: {r.note}" for r in rows if r.note]
    return "\n".join(out + (["", "notes:", *notes] if notes else []))


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"
