"""One drill from start to verdict: set up, drive and trouble the runs, quiesce, check, clean up.

A drill owns a fresh PostgreSQL schema and topic prefix, two projector processes, a reconciler
process, the payments API its refund tool sends to (`toolledger.drill.payments`, started first),
the runtime workers the dispatcher starts, and the drill's operator (in this process).
When every run has finished it stops the troubles, the reconciler and the payments API, makes
sure everything appended has been projected (a sentinel event per partition: once its verdict
exists, every earlier record of that partition was folded, which end offsets cannot promise),
stops the projectors so nothing moves, and hands the witnesses to `toolledger.drill.checks`.

With `broker_reset` the drill runs on a private broker and ends with its reset
(`toolledger.drill.reset`); with `broker_kills` it runs on a private Apache Kafka broker and
SIGKILLs it mid-drill, restarting it on its data (`Chaos.kill_broker`); with
`postgres_restarts` it runs on a private PostgreSQL and restarts it mid-drill.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from toolledger.api.service import OperatorService
from toolledger.devstack import KafkaKind, Services, remove_namespace
from toolledger.drill.acked import ACKED_FILE, acknowledged_kept, read_acked
from toolledger.drill.barrier import sentinel
from toolledger.drill.billing import DrillBilling
from toolledger.drill.chaos import Chaos, ChaosTally
from toolledger.drill.checks import Check, Evidence, Tally, judge
from toolledger.drill.driver import DispatchConfig, Dispatcher, DispatchTally, Progress
from toolledger.drill.killpoints import read_lines
from toolledger.drill.ledgerdb import LedgerDB
from toolledger.drill.model import TENANT
from toolledger.drill.operator import DrillOperator
from toolledger.drill.procs import Proc, Procs
from toolledger.drill.reset import broker_reset
from toolledger.drill.services import DrillServices, open_services
from toolledger.drill.tools import BILLING_ENV, PAYMENTS_ENV, drill
from toolledger.drill.verdicts import read_heard
from toolledger.drill.verify import refold_log
from toolledger.events.signing import SigningKey
from toolledger.projections.postgres import PostgresLedger
from toolledger.runtime.ledger import Ledger
from toolledger.settings import ProjectorSettings
from toolledger.wiring.stack import LedgerStack

log = logging.getLogger("toolledger.drill")


@dataclass(frozen=True)
class DrillConfig:
    """The size of a drill and how hard it is troubled. Intervals are mean seconds (0: never)."""

    runs: int = 50
    calls: int = 5
    kills: int = 100
    seed: int = 1
    workers: int = 4
    spares: int = 2
    runs_per_worker: int = 8
    partitions: int = 4
    #: The runtimes' path (`TOOLLEDGER_LEADER`): `auto`, the leader fast path (the projectors'
    #: leaders answer, so projector kills and zombies are leader kills and zombies), or `off`.
    leader: Literal["auto", "off"] = "auto"
    external_share: float = 0.15
    #: Share of refunds the payments API makes and then leaves unanswered (dropped).
    payments_drop_rate: float = 0.05
    double_drive_rate: float = 0.05
    dup_rate: float = 0.01
    slow_rate: float = 0.02
    poison: int = 3
    projector_kill_every: float = 8.0
    zombie_every: float = 30.0
    reconciler_kill_every: float = 30.0
    listen_kill_every: float = 5.0
    postgres_restarts: int = 0
    broker_reset: bool = False
    #: SIGKILLs of a private Apache Kafka broker mid-drill, each restarted on its data.
    broker_kills: int = 0
    #: Seconds before the drill gives up (None: `default_timeout` of its size).
    timeout: float | None = None
    keep: bool = False
    home: Path | None = None

    @property
    def time_limit(self) -> float:
        return self.timeout if self.timeout is not None else default_timeout(self)


#: Per step of a run (a model call or a tool call) and per kill: about five times what they cost
#: on a two-core machine that also runs the suite, so a machine 2.5 times slower still finishes
#: (the long drill, 1000 runs and 2000 kills, ran out of a fixed hour at 426 runs on one).
SECONDS_PER_STEP = 2.0
SECONDS_PER_KILL = 1.0
#: Starting the processes, the quiesce and the re-fold, whatever the size.
SECONDS_FIXED = 600.0


def default_timeout(config: DrillConfig) -> float:
    """How long a drill of this size may take before it gives up: it follows the work."""
    steps = config.runs * (config.calls + 1)
    return SECONDS_FIXED + SECONDS_PER_STEP * steps + SECONDS_PER_KILL * config.kills


@dataclass
class DrillReport:
    """What a drill did and what the checks found."""

    config: DrillConfig
    home: Path
    schema: str
    topic_prefix: str
    duration: float = 0.0
    dispatch: DispatchTally = field(default_factory=DispatchTally)
    chaos: ChaosTally = field(default_factory=ChaosTally)
    tally: Tally = field(default_factory=Tally)
    checks: list[Check] = field(default_factory=list)
    duplicates_appended: int = 0
    operator_settled: int = 0
    refold_events: int = 0
    #: Events the runtimes saw acknowledged, each found in the re-fold of the log.
    acknowledged_checked: int = 0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def violations(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


async def run_drill(
    config: DrillConfig, progress: Progress | None = None, *, services: Services | None = None
) -> DrillReport:
    """Run one drill; the report says what happened and whether every check held.

    `services` (the test suite's) are used as they are; without them the drill finds or starts
    its own (`toolledger.drill.services`).
    """
    home = config.home or Path(tempfile.mkdtemp(prefix="toolledger-drill-"))
    home.mkdir(parents=True, exist_ok=True)
    drill_services = await asyncio.to_thread(
        open_services,
        home,
        given=services,
        private_broker="apache"
        if config.broker_kills
        else "tansu"
        if config.broker_reset
        else None,
        private_postgres=config.postgres_restarts > 0,
    )
    report: DrillReport | None = None
    try:
        report = await _Drill(config, drill_services, home, progress).run()
        return report
    finally:
        await asyncio.to_thread(drill_services.close)
        if config.home is None and not config.keep and report is not None and report.ok:
            shutil.rmtree(home, ignore_errors=True)


def _private_broker(config: DrillConfig) -> KafkaKind | None:
    """The private broker a drill needs: Apache Kafka to kill (it keeps its data), tansu to
    reset (it always comes back empty), or none (the shared one)."""
    if config.broker_kills:
        return "apache"
    return "tansu" if config.broker_reset else None


class _Drill:
    def __init__(
        self, config: DrillConfig, services: DrillServices, home: Path, progress: Progress | None
    ) -> None:
        self.config = config
        self.services = services
        self.home = home
        self.progress = progress
        ident = secrets.token_hex(4)
        self.schema = f"drill_{ident}"
        self.prefix = f"drill{ident}."
        # Only this driver process (the drill's operator) holds the private key; every child
        # gets the public key, which its projectors need and its workers ignore.
        self.signer = SigningKey.generate("drill")
        self.settings = ProjectorSettings(
            database_url=services.database_url,
            kafka_bootstrap=services.kafka_bootstrap,
            schema_name=self.schema,
            topic_prefix=self.prefix,
            partitions=config.partitions,
            verify_keys=self.signer.verify_keys(),
        )
        self.env = {
            "TOOLLEDGER_DATABASE_URL": services.database_url,
            "TOOLLEDGER_KAFKA_BOOTSTRAP": services.kafka_bootstrap,
            "TOOLLEDGER_SCHEMA": self.schema,
            "TOOLLEDGER_TOPIC_PREFIX": self.prefix,
            "TOOLLEDGER_PARTITIONS": str(config.partitions),
            "TOOLLEDGER_VERIFY_KEYS": self.signer.public_setting(),
            "TOOLLEDGER_LEADER": config.leader,
            BILLING_ENV: str(home / "billing.db"),
        }
        self.report = DrillReport(config, home, self.schema, self.prefix)

    async def run(self) -> DrillReport:
        started = time.monotonic()
        (self.home / "logs").mkdir(exist_ok=True)
        (self.home / "results").mkdir(exist_ok=True)
        procs = Procs(self.home / "logs", self.env)
        stack = await LedgerStack.connect(self.settings)
        db = LedgerDB(self.services.database_url, self.schema)
        tasks: list[asyncio.Task[None]] = []
        try:
            ledger = Ledger.from_stack(stack, verdict_timeout=self.settings.verdict_timeout_s)
            billing = DrillBilling(self.home / "billing.db")
            payments = await self._start_payments(procs)
            rng = random.Random(self.config.seed)
            chaos = Chaos(
                procs,
                db,
                stack.events,
                random.Random(rng.random()),
                reconciler_args=[
                    "--tools",
                    "toolledger.drill.tools",
                    "--backoff",
                    "0.5",
                    "--max-backoff",
                    "2",
                    "--max-attempts",
                    "100",
                    "--scan-every",
                    "0.2",
                ],
                postgres=self.services.postgres,
            )
            service = OperatorService(stack.store, stack.commands, signing_keys=(self.signer,))
            operator = DrillOperator(service, db, billing)
            dispatcher = Dispatcher(
                DispatchConfig(
                    runs=self.config.runs,
                    calls=self.config.calls,
                    kills=self.config.kills,
                    workers=self.config.workers,
                    spares=self.config.spares,
                    runs_per_worker=self.config.runs_per_worker,
                    external_share=self.config.external_share,
                    double_drive_rate=self.config.double_drive_rate,
                    dup_rate=self.config.dup_rate,
                    slow_rate=self.config.slow_rate,
                    deadline=started + self.config.time_limit,
                ),
                procs,
                db,
                ledger,
                self.home,
                random.Random(rng.random()),
                self.progress,
            )
            chaos.start_projector()
            chaos.start_projector()
            chaos.start_reconciler()

            async def operate() -> None:
                while await chaos.pause(0.5):
                    await operator.work()

            async def keep_alive() -> None:
                while await chaos.pause(1.0):
                    await chaos.tend()

            c = self.config
            loops = [
                chaos.every(c.projector_kill_every, chaos.kill_projector),
                chaos.every(c.zombie_every, chaos.zombie_projector),
                chaos.every(c.reconciler_kill_every, chaos.kill_reconciler),
                chaos.every(c.listen_kill_every, lambda: chaos.kill_listen(dispatcher.live_procs)),
                chaos.poison(c.poison, within=20.0),
                chaos.restart_postgres(c.postgres_restarts, within=2.0 + 4 * c.postgres_restarts),
                chaos.kill_broker(
                    c.broker_kills, within=3.0 + 12 * c.broker_kills, kill=self.services.kill_broker
                ),
                operate(),
                keep_alive(),
            ]
            tasks = [asyncio.create_task(loop) for loop in loops]
            await dispatcher.run()
            chaos.stopping.set()
            await asyncio.gather(*tasks)
            await self._quiesce(stack, chaos, payments)
            await self._judge(stack, db, billing, dispatcher, chaos, operator)
            if self.config.broker_reset:
                self.report.checks += await broker_reset(
                    self.services, stack, chaos, dispatcher, billing, self.config.partitions
                )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            procs.close()
            await stack.close()
            await db.close()
            if not self.config.keep:
                await self._drop()
            self.report.duration = time.monotonic() - started
        return self.report

    async def _start_payments(self, procs: Procs) -> Proc:
        """The drill's payments API (`toolledger.drill.payments`), listening before anything
        that sends to it starts: its URL goes into every later child's environment."""
        address = self.home / "payments.url"
        proc = procs.python(
            "payments",
            "toolledger.drill.payments",
            "--billing",
            str(self.home / "billing.db"),
            "--address-file",
            str(address),
            "--drop-rate",
            str(self.config.payments_drop_rate),
            "--seed",
            str(self.config.seed),
        )
        deadline = time.monotonic() + 60
        while not address.exists():
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the drill's payments API did not start (exit status {proc.returncode}): "
                    f"{proc.output()[-2000:]}"
                )
            await asyncio.sleep(0.05)
        procs.env[PAYMENTS_ENV] = address.read_text()
        return proc

    @staticmethod
    def _stop_payments(payments: Proc) -> list[str]:
        """Stop the payments API; an error if it had ended before (refunds would have failed)."""
        if not payments.alive():
            tail = payments.output()[-3000:]
            return [f"the payments API exited with {payments.returncode}:\n{tail}"]
        payments.stop()
        return []

    async def _quiesce(self, stack: LedgerStack, chaos: Chaos, payments: Proc) -> None:
        """Stop every appender, then wait until everything appended has been projected."""
        if chaos.reconciler is not None and chaos.reconciler.alive():
            chaos.reconciler.stop()
        chaos.errors += self._stop_payments(payments)
        chaos.keep_projectors()
        for partition in range(self.config.partitions):
            appended = sentinel("sentinel", partition, self.config.partitions)
            verdict = await stack.commands.append_and_await(appended, timeout=120)
            assert verdict.accepted, verdict.detail
        for proc in chaos.projectors:
            proc.stop()

    async def _judge(
        self,
        stack: LedgerStack,
        db: LedgerDB,
        billing: DrillBilling,
        dispatcher: Dispatcher,
        chaos: Chaos,
        operator: DrillOperator,
    ) -> None:
        listed = set(await operator.check_listing())
        unsettled = set(await db.unsettled(TENANT))
        live = await stack.store.snapshot()
        heard = read_heard(dispatcher.verdicts)
        acked = read_acked(self.home / ACKED_FILE)
        refold = await refold_log(
            stack,
            db,
            live.digest(),
            PostgresLedger(
                self.services.database_url,
                f"{self.schema}_refold",
                verify_keys=self.settings.verify_keys,
            ),
            heard=[h.event_id for h in heard] + acked,
        )
        dispatch = dispatcher.tally
        evidence = Evidence(
            snapshot=live,
            effects=billing.effects(),
            requests=billing.requests(),
            runs=dispatcher.runs,
            calls=self.config.calls,
            tenant=TENANT,
            reconciler_pids=chaos.reconciler_pids,
            listing=operator.checks,
            unsettled_at_end=unsettled,
            listed_at_end=listed,
            refold=refold,
            poison=chaos.tally.poison,
            kills=dispatch.kills,
            kills_requested=self.config.kills,
            unattributed_kills=dispatch.kills["unattributed"],
            errors=dispatch.errors + chaos.errors,
            kill_kinds=dispatcher.kill_kinds,
            timeout=self.config.time_limit,
            timed_out=dispatch.timed_out,
            zombies=chaos.tally.zombies,
            zombies_stood_down=chaos.tally.zombies_stood_down,
            identity_stops=chaos.tally.identity_stops,
            heard=heard,
            resent_tools=frozenset(t.name for t in drill if t.effect.replays_key_for),
        )
        self.report.checks, self.report.tally = judge(evidence)
        kept = acknowledged_kept([h.event_id for h in heard], acked, refold.verdicts)
        self.report.checks.append(kept)
        self.report.acknowledged_checked = len({h.event_id for h in heard} | set(acked))
        self.report.dispatch = dispatch
        self.report.chaos = chaos.tally
        self.report.duplicates_appended = len(read_lines(dispatcher.dup_log))
        self.report.operator_settled = operator.settled
        self.report.refold_events = refold.events

    async def _drop(self) -> None:
        """Drop the drill's schemas and delete its topics (best effort)."""
        services = Services(self.services.database_url, self.services.kafka_bootstrap)
        await remove_namespace(services, (self.schema, f"{self.schema}_refold"), self.prefix)
