"""The projector in one process against real Kafka and PostgreSQL: unreadable records, a broker
that lost its data, facts, and replay."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests import builders as b
from tests.integration.procs import run_toolledger, toolledger_env
from tests.isolated import Isolated, running_stack
from toolledger.devstack import start_tansu, stop_service
from toolledger.errors import LedgerUnavailable
from toolledger.events.codec import default_codec, encode, frame, unframe
from toolledger.events.fold import broken_chains
from toolledger.events.log import LogIdentityError, partition_for
from toolledger.events.models import Event
from toolledger.projections.facts import facts_in
from toolledger.projections.ownership import PostgresPartitionLocks
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.projector import Projector
from toolledger.schemas import SchemaRegistry
from toolledger.settings import ProjectorSettings as Settings
from toolledger.wiring.stack import LedgerStack

FIXTURE_SCHEMAS = Path(__file__).resolve().parent.parent / "unit" / "schemas_fixture"


def _settings(isolated: Isolated, **extra: Any) -> Settings:
    return isolated.settings(Settings, verify_keys=b.KEYS, **extra)


@pytest.fixture
async def stack(isolated: Isolated) -> AsyncIterator[LedgerStack]:
    async with running_stack(_settings(isolated)) as stack:
        yield stack


async def _project(stack: LedgerStack, *events: Event) -> None:
    for event in events:
        await stack.commands.append_and_await(event, timeout=10)


async def _read_all(
    stack: LedgerStack, topic: str, expect: int
) -> list[tuple[int, bytes, dict[str, bytes]]]:
    log = {"dlq": stack.dlq, "facts": stack.facts}[topic]
    reader = log.reader()
    out: list[tuple[int, bytes, dict[str, bytes]]] = []
    try:
        await reader.assign(dict.fromkeys(range(await log.partition_count()), 0))
        for _ in range(100):
            for records in (await reader.fetch(max_wait=0.1)).values():
                out += [(r.partition, r.value, dict(r.headers)) for r in records]
            if len(out) >= expect:
                break
    finally:
        await reader.close()
    return out


async def test_undecodable_records_go_to_the_dlq_with_a_reason_and_later_events_are_projected(
    stack: LedgerStack,
) -> None:
    """Garbage and a truncated record must neither stop the projector nor vanish silently:
    both land in the DLQ topic and `dead_letters`, their runs are quarantined, and every
    other event after them is still projected."""
    await stack.events.append("garbage-run", b"\x00\x01 not avro at all")
    await stack.events.append("cut-run", encode(b.reserved("cut-run", "c1"))[:-7])
    after_garbage = b.reserved("garbage-run", "c2")
    healthy = b.reserved("healthy-run", "c1")
    await _project(stack, healthy)
    verdict = await stack.commands.append_and_await(after_garbage, timeout=10)
    assert (verdict.accepted, verdict.reason) == (False, "quarantined")
    assert (await stack.store.get_call(healthy.key)) is not None

    letters = await stack.store.dead_letters()
    reasons = {d.run_id: d.reason for d in letters}
    assert set(reasons) == {"garbage-run", "cut-run"}
    assert "not_single_object" in reasons["garbage-run"]
    assert "truncated" in reasons["cut-run"]
    dlq = await _read_all(stack, "dlq", expect=2)
    assert len(dlq) == 2
    for _, _, headers in dlq:
        assert {"reason", "partition", "offset", "topic"} <= set(headers)
    run = await stack.store.get_run("cut-run")
    assert run is not None and run.quarantined


async def test_an_unknown_schema_halts_its_partition_until_a_reader_that_knows_it_is_deployed(
    isolated: Isolated, pg_dsn: str, pg_schema: str
) -> None:
    """A record written with a newer schema must not be skipped (that would silently drop an
    event of some run): its partition halts, other partitions go on, and a projector whose
    registry knows the writer schema resumes exactly where the old one stopped."""
    released = SchemaRegistry.packaged()
    fixture = SchemaRegistry.from_dirs(FIXTURE_SCHEMAS)
    registry = SchemaRegistry([*released, *(s for s in fixture if s.version == 4)])
    settings = _settings(isolated)
    old = await LedgerStack.connect(settings, run_projector=True)
    newer = next(s for s in registry.versions("CallReserved") if s.version == 4)
    future = b.reserved("future-run", "c1")
    _, datum = default_codec().to_datum(future)
    position = await old.events.append("future-run", frame(newer, {**datum, "attempt_limit": 3}))
    after = b.reserved("future-run", "c2")
    await old.commands.append(after, timeout=5)
    run = next(
        f"other-{n}" for n in range(100) if partition_for(f"other-{n}", 2) != position.partition
    )
    other = b.reserved(run, "c1")
    try:
        # the other partition goes on
        assert (await old.commands.append_and_await(other, timeout=10)).accepted
        for _ in range(200):
            if position.partition in old.projector.stats.halted:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.02)
        halted = old.projector.stats.halted  # type: ignore[union-attr]
        assert position.partition in halted
        assert "Deploy readers before writers" in halted[position.partition]
        assert await old.store.get_call(after.key) is None
    finally:
        await old.close()

    codec = default_codec()

    def upgraded(data: bytes) -> Event:
        datum = unframe(
            registry,
            data,
            reader=SchemaRegistry.packaged().latest(unframe(registry, data).writer.name),
        )
        return codec.from_datum(datum.value, datum.reader)

    new = await LedgerStack.connect(settings, run_projector=False)
    try:
        projector = Projector(
            new.events, new.store, PostgresPartitionLocks(pg_dsn, pg_schema), decode=upgraded
        )
        task = asyncio.create_task(projector.run())
        for _ in range(300):
            if await new.store.get_call(after.key) is not None:
                break
            await asyncio.sleep(0.02)
        projector.stop()
        await asyncio.wait_for(task, 10)
        record = await new.store.get_call(future.key)
        assert record is not None and record.status == "started"
        assert await new.store.get_call(after.key) is not None
    finally:
        await new.close()


async def test_a_broker_that_lost_its_data_stops_the_projector_and_changes_nothing(
    pg_dsn: str, pg_schema: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The local broker keeps nothing across a restart. The projector must notice (the epoch
    marker is gone) and stop with the log-identity error instead of idling or folding a new
    history; a runtime must fail closed; PostgreSQL must keep everything it had."""
    broker = start_tansu(tmp_path / "broker")
    try:
        on_broker = Isolated(pg_dsn, broker.address, pg_schema, f"{topic_prefix}.")
        settings = _settings(on_broker, identity_check_s=0.2)
        stack = await LedgerStack.connect(settings, run_projector=True)
        try:
            await _project(stack, *(b.reserved(f"run-{n}", "c1") for n in range(10)))
            before = await stack.store.digest()
            stop_service(broker)
            broker = start_tansu(tmp_path / "broker", port=int(broker.address.rsplit(":", 1)[1]))
            with pytest.raises(LogIdentityError, match=r"epoch marker|gone|does not exist"):
                await asyncio.wait_for(stack.projector_task, 15)
            late = b.reserved("run-late", "c1")
            with pytest.raises(LedgerUnavailable):
                await stack.commands.append_and_await(late, timeout=1.0)
            assert await stack.store.digest() == before
            assert await stack.store.verdicts([late.event_id]) == {}
        finally:
            await stack.close()
    finally:
        stop_service(broker)


async def test_every_verdict_is_published_as_a_fact_with_its_position(stack: LedgerStack) -> None:
    """Processors read facts, never requests: each decided event, accepted or rejected, must
    reach the facts topic with the verdict and the request's position."""
    r = b.reserved("facts-run", "c1")
    events = [r, b.reserved("facts-run", "c1"), b.completed(r)]
    await _project(stack, *events)
    records = await _read_all(stack, "facts", expect=3)
    facts = [fact for _, value, _ in records for fact in facts_in(value)]
    by_id = {f.verdict.event_id: f for f in facts}
    assert set(by_id) == {e.event_id for e in events}
    assert [by_id[e.event_id].verdict.accepted for e in events] == [True, False, True]
    assert by_id[r.event_id].offset < by_id[events[2].event_id].offset


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **toolledger_env(settings), "COLUMNS": "200"}
    return run_toolledger(env, *args)


async def test_replay_from_offset_zero_rebuilds_the_same_ledger_and_verify_catches_a_tampered_row(
    isolated: Isolated, pg_dsn: str, pg_schema: str
) -> None:
    """Dropping the projection and replaying the log must give the same ledger (rows,
    history, digest), in one process or split across two, into a schema or in memory; and
    `replay --verify` must notice a record changed by hand, either way."""
    settings = _settings(isolated)
    stack = await LedgerStack.connect(settings, run_projector=True)
    try:
        for n in range(20):
            r = b.reserved(f"run-{n % 7}", f"c{n}")
            await _project(stack, r, b.completed(r) if n % 3 else b.indeterminate(r))
        await stack.events.append("run-3", b"poison")
        await _project(stack, b.reserved("run-4", "last"))
        live_digest = await stack.store.digest()
    finally:
        await stack.close()

    replica = f"{pg_schema}_r1"
    ok = _cli(settings, "replay", "--into", replica, "--verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "identical" in ok.stdout
    split = _cli(settings, "replay", "--into", f"{pg_schema}_r3", "--verify", "--processes", "2")
    assert split.returncode == 0, split.stdout + split.stderr
    assert "identical" in split.stdout
    assert f"digest {live_digest[:16]}" in ok.stdout
    assert f"digest {live_digest[:16]}" in split.stdout
    for processes in ("1", "2"):
        in_memory = _cli(settings, "replay", "--verify", "--processes", processes)
        assert in_memory.returncode == 0, in_memory.stdout + in_memory.stderr
        assert "into memory" in in_memory.stdout and "identical" in in_memory.stdout
        assert f"digest {live_digest[:16]}" in in_memory.stdout
        assert "(1 dead letters)" in in_memory.stdout
    copy = PostgresLedger(pg_dsn, replica)
    await copy.start()
    try:
        assert await copy.digest() == live_digest
    finally:
        await copy.close()

    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f'UPDATE "{pg_schema}".tool_executions SET status = $1 WHERE key = $2',  # noqa: S608
            "failed",
            "run-1:c1",
        )
        bad = _cli(settings, "replay", "--into", f"{pg_schema}_r2", "--verify")
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "run-1:c1" in bad.stdout and "status" in bad.stdout
        bad_in_memory = _cli(settings, "replay", "--verify")
        assert bad_in_memory.returncode == 1, bad_in_memory.stdout + bad_in_memory.stderr
        assert "run-1:c1" in bad_in_memory.stdout and "status" in bad_in_memory.stdout
        bad_split = _cli(settings, "replay", "--verify", "--processes", "2")
        assert bad_split.returncode == 1, bad_split.stdout + bad_split.stderr
        assert "differs from the live ledger" in bad_split.stdout
        assert f"digest {live_digest[:16]}" in bad_split.stdout
    finally:
        for schema in (replica, f"{pg_schema}_r2", f"{pg_schema}_r3"):
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


async def _tamper(dsn: str, schema: str, statement: str, *args: object) -> None:
    """Run `statement` on the history with its append-only trigger lifted, as an attacker with
    the table owner's rights would."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(f'SET LOCAL search_path = "{schema}"')
            await conn.execute(
                "ALTER TABLE tool_execution_history "
                "DISABLE TRIGGER tool_execution_history_append_only"
            )
            await conn.execute(statement, *args)
            await conn.execute(
                "ALTER TABLE tool_execution_history "
                "ENABLE TRIGGER tool_execution_history_append_only"
            )
    finally:
        await conn.close()


async def test_replay_verify_names_the_key_and_offset_of_a_tampered_or_removed_history_entry(
    isolated: Isolated, pg_dsn: str, pg_schema: str
) -> None:
    """Each history entry is chained to the previous one of its key: an entry altered by hand
    breaks the chain at itself, a removed one breaks it at the next entry of the key, and
    `replay --verify` names both."""
    settings = _settings(isolated)
    stack = await LedgerStack.connect(settings, run_projector=True)
    try:
        altered, removed = b.reserved("chain-a", "c1"), b.reserved("chain-b", "c1")
        await _project(stack, altered, b.completed(altered), b.completed(altered))
        await _project(stack, removed, b.completed(removed), b.reserved("chain-b", "c2"))
        altered_history = await stack.store.history(altered.key)
        removed_history = await stack.store.history(removed.key)
        assert broken_chains((await stack.store.snapshot()).history) == []
    finally:
        await stack.close()
    assert [h.accepted for h in altered_history] == [True, True, False]
    assert "true" in altered_history[1].event_json
    assert len({h.chain_hash for h in altered_history}) == 3

    target = altered_history[1]
    await _tamper(
        pg_dsn,
        pg_schema,
        "UPDATE tool_execution_history SET event_json = replace(event_json, 'true', 'false') "
        'WHERE partition = $1 AND "offset" = $2',
        target.partition,
        target.offset,
    )
    gone, after = removed_history[0], removed_history[1]
    await _tamper(
        pg_dsn,
        pg_schema,
        'DELETE FROM tool_execution_history WHERE partition = $1 AND "offset" = $2',
        gone.partition,
        gone.offset,
    )
    try:
        bad = _cli(settings, "replay", "--into", f"{pg_schema}_r3", "--verify")
    finally:
        conn = await asyncpg.connect(pg_dsn)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}_r3" CASCADE')
        await conn.close()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert (
        f"history chain of key {altered.key} breaks at partition {target.partition} "
        f"offset {target.offset} (call_completed)"
    ) in bad.stdout, bad.stdout
    assert (
        f"history chain of key {removed.key} breaks at partition {after.partition} "
        f"offset {after.offset}"
    ) in bad.stdout, bad.stdout
    assert (
        f"history at partition {gone.partition} offset {gone.offset} exists only in the replay"
    ) in bad.stdout, bad.stdout


async def test_history_and_dead_letters_commands_show_what_the_ledger_holds(
    stack: LedgerStack, isolated: Isolated
) -> None:
    r = b.reserved("cli-run", "c1")
    await _project(stack, r, b.completed(r), b.completed(r))
    await stack.events.append("cli-bad", b"junk")
    await _project(stack, b.reserved("cli-bad", "c1"))
    settings = _settings(isolated)
    shown = _cli(settings, "history", "cli-run:c1")
    assert shown.returncode == 0, shown.stderr
    assert "call_reserved" in shown.stdout and "late_outcome" in shown.stdout
    letters = _cli(settings, "dead-letters", "list")
    assert letters.returncode == 0, letters.stderr
    assert "cli-bad" in letters.stdout


async def test_the_projector_survives_its_database_connections_being_killed(
    stack: LedgerStack, pg_dsn: str
) -> None:
    """A PostgreSQL restart or failover ends every session. The projector must not exit: it
    re-reads its positions once the database answers and goes on, applying nothing twice."""
    first = b.reserved("pg-run", "c1")
    await _project(stack, first)
    conn = await asyncpg.connect(pg_dsn)
    try:
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name IN ($1, $2)",
            f"toolledger-store-{os.getpid()}",
            f"toolledger-locks-{os.getpid()}",
        )
    finally:
        await conn.close()
    assert killed >= 2
    second = b.reserved("pg-run", "c2")
    verdict = await stack.commands.append_and_await(second, timeout=15)
    assert verdict.accepted
    assert not stack.projector_task.done()
    history = await stack.store.history(first.key)
    assert [h.event_id for h in history] == [first.event_id]


async def test_a_nul_or_lone_surrogate_in_a_tool_error_does_not_stall_the_partition(
    stack: LedgerStack,
) -> None:
    """PostgreSQL text cannot hold NUL: an error message carrying one used to make every batch
    of its partition fail forever. Such characters are stored as U+FFFD."""
    r = b.reserved("nul-run", "c1")
    broken = b.failed(r).model_copy(update={"error": "x"})
    broken = type(broken).model_validate({**broken.model_dump(), "error": "bad\x00byte \udc80"})
    await _project(stack, r, broken)
    record = await stack.store.get_call(r.key)
    assert record is not None and record.error == "bad\ufffdbyte \ufffd"
    after = b.reserved("nul-run", "c2")
    assert (await stack.commands.append_and_await(after, timeout=10)).accepted
