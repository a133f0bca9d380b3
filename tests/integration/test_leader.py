"""The leader fast path on Kafka + PostgreSQL: crashes, an unreachable leader, bad frames.

Each test runs a real projector (in this process, or a child it stops by pid) whose leader
answers a `LeaderPort`, and checks the answers against what the projection makes of the log,
which stays the only truth. Named for the failure each guards against.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import builders as b
from tests.contract.runtime_harness import ARGS
from tests.fake_billing import FakeBilling, issue_credit, issue_credit_unreconciled, use_service
from tests.integration.leader_support import all_led as _all_led
from tests.integration.leader_support import calls as _calls
from tests.integration.leader_support import history_count as _history_count
from tests.integration.leader_support import hold_commits as _hold_commits
from tests.integration.leader_support import leader_of as _leader
from tests.integration.leader_support import leader_settings as _settings
from tests.integration.leader_support import runtime_port as _runtime
from tests.integration.procs import Procs, toolledger_env, until
from tests.isolated import Isolated, running_stack
from tests.pipelined_tools import credit
from toolledger import Ledger
from toolledger.events.codec import decode, encode
from toolledger.events.log import partition_for
from toolledger.events.models import Event
from toolledger.events.records import CallRecord, Verdict
from toolledger.leader.runtime_side.frames import Kind, encode_frame
from toolledger.port import CallQuery
from toolledger.wiring.stack import LedgerStack


async def test_a_leader_killed_before_its_projection_committed_leaves_the_same_verdicts(
    isolated: Isolated, tmp_path: Path
) -> None:
    """Verdicts a leader answered from memory, then died before committing any of them, must
    be exactly the verdicts the next owner reaches by folding the log: an answer is never a
    promise the ledger can break."""
    settings = _settings(isolated)
    procs = Procs(tmp_path)
    try:
        async with running_stack(settings, run_projector=False) as stack:
            worker = procs.python(
                "leader", "tests.integration.leader_worker", env=toolledger_env(settings)
            )
            await worker.wait_for("leading", timeout=30)
            async with _runtime(stack, settings) as port:
                await _all_led(port, settings.partitions)
                answered = [await port.append_and_await(e, 10) for e in _calls(6)]
                assert port.stats == {"leader": 12, "direct": 0}
                ids = [v.event_id for v in answered]
                assert await stack.store.verdicts(ids) == {}, "the worker committed nothing"
            worker.kill()
            assert worker.returncode == -signal.SIGKILL
        async with running_stack(settings) as successor:
            stored = await until(
                lambda: _all_verdicts(successor, ids), timeout=30, what="the successor's verdicts"
            )
        assert [stored[i] for i in ids] == answered
        assert [v.accepted for v in answered] == [True] * 12
    finally:
        procs.close()


async def _all_verdicts(
    stack: LedgerStack, ids: list[uuid.UUID]
) -> dict[uuid.UUID, Verdict] | None:
    found = await stack.store.verdicts(ids)
    return found if len(found) == len(ids) else None


async def test_an_unresponsive_leader_sends_calls_direct_within_the_bound_none_lost_or_doubled(
    isolated: Isolated,
) -> None:
    """A leader that appends but answers too late must not hold a runtime past the bound, and
    the resend on the direct path (same event_id) must not apply any request twice."""
    settings = _settings(isolated, leader_timeout_ms=300)
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, settings.partitions)
        leader = _leader(stack)
        answer = leader._append

        async def late(event: Event, data: bytes) -> Any:
            got = await answer(event, data)  # appended and proven, then answered too late
            await asyncio.sleep(30)
            return got

        leader._append = late  # type: ignore[method-assign]
        events = _calls(4)
        started = time.monotonic()
        verdicts = [await port.append_and_await(e, 10) for e in events]
        elapsed = time.monotonic() - started
        assert port.stats["direct"] == len(events)
        # One bound for the first call per partition; the rest go direct at once.
        assert elapsed < 2 * 0.3 + 5, elapsed
        assert [v.accepted for v in verdicts] == [True] * len(events)
        ids = [e.event_id for e in events]
        counts = await _history_count(isolated, ids)
        assert counts == dict.fromkeys(ids, 1)


async def test_bad_frames_close_their_connection_and_append_nothing(isolated: Isolated) -> None:
    """Garbage, an oversized length, an unknown kind, an answer sent as a request, bytes that
    are not an event, a `READ_INDEX` naming no partitions or a `RESERVE` of anything but a
    reservation must close that connection
    and never reach the log or stop the projector; an operator decision is refused; a good
    request on a new connection is still answered."""
    settings = _settings(isolated)
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        leaders = await _all_led(port, settings.partitions)
        host, _, number = str(next(iter(leaders.values()))).rpartition(":")
        bad = [
            struct.pack(">I", 2**31) + b"\x01",
            struct.pack(">I", 2),
            encode_frame(Kind.APPEND, 1, b"\xc3\x01not avro at all"),
            struct.pack(">I", 5) + bytes([99]) + struct.pack(">I", 7),
            encode_frame(Kind.VERDICT, 3, b"{}"),
            encode_frame(Kind.READ, 4, b"not json"),
            encode_frame(Kind.READ_INDEX, 6, b'{"partitions": "all"}'),
            encode_frame(Kind.RESERVE, 5, encode(b.completed(b.reserved("r-bad", "c1")))),
        ]
        for data in bad:
            reader, writer = await asyncio.open_connection(host, int(number))
            writer.write(data)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b"", data[:8]
            writer.close()
        reserved = b.reserved("r-ops", "c1")
        signed = b.resolved(reserved, 1)
        reader, writer = await asyncio.open_connection(host, int(number))
        writer.write(encode_frame(Kind.APPEND, 9, encode(signed)))
        await writer.drain()
        header = await asyncio.wait_for(reader.readexactly(9), 10)
        length, kind, request = struct.unpack(">IBI", header)
        body = await reader.readexactly(length - 5)
        assert (Kind(kind), request) == (Kind.REFUSED, 9), body
        writer.close()
        verdict = await port.append_and_await(reserved, 10)
        assert verdict.accepted and port.stats == {"leader": 1, "direct": 0}
        assert not stack.projector_task.done()
        assert await stack.store.dead_letters() == []
        assert await stack.store.verdicts([signed.event_id]) == {}


@pytest.mark.parametrize("partitions", [2])
async def test_reads_of_a_key_come_from_the_leaders_memory(
    isolated: Isolated, partitions: int
) -> None:
    """The fast-path read of a key must show the leader's latest fold, committed or not, and
    say "no such call" for a key nobody reserved (it was read with the partition's offset)."""
    settings = _settings(isolated)
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, partitions)
        reserved = b.reserved("r-read", "c1")
        await port.append_and_await(reserved, 10)
        record = await port.read_call(reserved.key)
        assert record is not None and record.status == "started"
        assert await port.read_call("r-read:nobody") is None
        assert json.loads(record.model_dump_json())["reservation_id"] == str(
            reserved.reservation_id
        )


@pytest.mark.parametrize("partitions", [2])
async def test_reads_of_postgresql_after_a_leaders_answer_wait_for_its_commit(
    isolated: Isolated, partitions: int
) -> None:
    """A leader answers before its projection commits, so a runtime reading PostgreSQL right
    after (the run it just paused, the calls of a run it just reserved: the twin check) would
    see the ledger behind its own writes. Such a read must wait until the projection committed
    what the leader answered this port in that partition, and a read of a partition this port
    has nothing outstanding in must not wait at all."""
    settings = _settings(isolated)
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, partitions)
        released = _hold_commits(stack.store)
        reserved = b.reserved("r-ryw", "c1")
        assert (await port.append_and_await(reserved, 10)).accepted
        assert port.stats == {"leader": 1, "direct": 0}
        assert await stack.store.get_call(reserved.key) is None, "nothing committed yet"
        mine = partition_for("r-ryw", partitions)
        other = next(f"r-{i}" for i in range(100) if partition_for(f"r-{i}", partitions) != mine)
        assert await asyncio.wait_for(port.read_run(other), 5) is None  # nothing to wait for
        listed = asyncio.create_task(port.list_calls(CallQuery(tenant_id=None, run_id="r-ryw")))
        run = asyncio.create_task(port.read_run("r-ryw"))
        await asyncio.sleep(0.3)
        assert not listed.done() and not run.done(), "read before the projection committed"
        released.set()
        (record,) = await asyncio.wait_for(listed, 10)
        assert (record.key, record.status) == (reserved.key, "started")
        found = await asyncio.wait_for(run, 10)
        assert found is not None and found.tenant_id == "acme"
        assert await stack.store.get_call(reserved.key) is not None


@pytest.mark.parametrize("partitions", [2])
async def test_the_projector_does_not_decode_again_what_its_leader_appended(
    isolated: Isolated, partitions: int
) -> None:
    """The records a leader appended come back to its projector as the bytes it sent, which
    decode to the events it already holds: the projector must fold those events rather than
    decode them a second time, still decode every other writer's records, and commit the
    verdicts the leader answered.

    A partition is carried from a runtime's first request to it: a fetch already waiting on it
    then may bring that first record back (once, as the partition comes into use), so each
    run's partition is put in use, and its records committed, before decoding is counted."""
    settings = _settings(isolated)
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, partitions)
        projector = stack.projector
        assert projector is not None
        warm = [b.reserved(f"r-own-{i}", f"warm{i}") for i in range(3)]
        for event in warm:
            assert (await port.append_and_await(event, 10)).accepted
        await until(
            lambda: _all_verdicts(stack, [e.event_id for e in warm]),
            timeout=15,
            what="the warm-up committed",
        )
        decoded: list[uuid.UUID] = []

        def counting(value: bytes) -> Event:
            event = decode(value)
            decoded.append(event.event_id)
            return event

        projector.decode = counting
        events = _calls(4, tag="r-own")
        answered = [await port.append_and_await(e, 10) for e in events]
        assert port.stats == {"leader": 3 + 8, "direct": 0}
        foreign = b.reserved("r-foreign", "c1")
        await stack.commands.append_and_await(foreign, 10)
        ids = [e.event_id for e in events]
        committed = await until(
            lambda: _all_verdicts(stack, ids), timeout=15, what="the leader's records committed"
        )
        assert [committed[i] for i in ids] == answered
        assert decoded == [foreign.event_id]


async def test_a_pipelined_call_runs_on_the_leaders_answers_while_no_commit_lands(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A pipelined call must run on the leader's acknowledgement and verdicts alone: with every
    projector commit held it still completes, one credit made, its key read with its
    reservation (one request); and once the commits land, the ledger records the same
    completed calls (the answers were the log's)."""
    settings = _settings(isolated)
    service = use_service(FakeBilling(tmp_path / "billing.db"))
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, settings.partitions)
        released = _hold_commits(stack.store)
        ledger = Ledger(port, verdict_timeout=5)
        outcome = await ledger.call(
            credit, run_id="r-pipe", tool_call_id="c1", tenant_id="acme", arguments=ARGS
        )
        assert outcome.status == "completed" and await stack.store.get_call("r-pipe:c1") is None
        assert port.stats == {"leader": 2, "direct": 0}
        # The run is bound now, so the next call is pipelined, its key's read with it.
        second = await ledger.call(
            credit, run_id="r-pipe", tool_call_id="c2", tenant_id="acme", arguments=ARGS
        )
        assert second.status == "completed" and await stack.store.get_call("r-pipe:c2") is None
        # c1: its key read, its reservation (verdict first: the run was bound to nobody yet),
        # its outcome; c2: its reservation carrying the read of its key, its outcome.
        assert port.sent == {"READ": 1, "RESERVE": 1, "APPEND": 3}
        released.set()
        for key in ("r-pipe:c1", "r-pipe:c2"):
            record = await until(
                functools.partial(_completed, stack, key), timeout=30, what="the committed call"
            )
            assert record.version == 2
        assert service.effects() == 2
        await ledger.close()


async def _completed(stack: LedgerStack, key: str) -> CallRecord | None:
    record = await stack.store.get_call(key)
    return record if record is not None and record.status == "completed" else None


async def test_a_new_calls_read_and_reservation_are_one_request_and_a_replay_appends_nothing(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A verdict-first call of a new key must cost its runtime two requests to the leader (the
    reservation, which carries the read of its key, and the outcome), and the same call made
    again must be answered from the key's record by one request, with nothing appended."""
    settings = _settings(isolated)
    service = use_service(FakeBilling(tmp_path / "billing.db"))
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, settings.partitions)
        ledger = Ledger(port, verdict_timeout=5)
        first = await ledger.call(
            issue_credit, tenant_id="acme", arguments=ARGS, run_id="r-one", tool_call_id="c1"
        )
        assert first.status == "completed" and port.stats == {"leader": 2, "direct": 0}
        assert port.sent == {"RESERVE": 1, "APPEND": 1}
        ends = await stack.events.end_offsets()
        again = await ledger.call(
            issue_credit, tenant_id="acme", arguments=ARGS, run_id="r-one", tool_call_id="c1"
        )
        assert again.replayed and again.value == first.value
        assert port.stats == {"leader": 3, "direct": 0}
        assert port.sent == {"RESERVE": 2, "APPEND": 1}
        assert await stack.events.end_offsets() == ends, "the replay appended something"
        await ledger.close()
        await port.settled()  # what the leader answered, committed
        history = await stack.store.history("r-one:c1")
        assert [h.event_type for h in history] == ["call_reserved", "call_completed"]
        assert service.effects() == 1


async def test_a_reservation_whose_answer_was_lost_is_resent_not_taken_for_another_holder(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A leader that appended a reservation and never answered leaves its record in the ledger
    as `started`. The runtime's direct path then reads that record: it must know the
    reservation for its own (resend it, same event_id, for its verdict) and run the tool once,
    not answer that another driver holds the call."""
    settings = _settings(isolated, leader_timeout_ms=300)
    service = use_service(FakeBilling(tmp_path / "billing.db"))
    async with running_stack(settings) as stack, _runtime(stack, settings) as port:
        await _all_led(port, settings.partitions)
        leader = _leader(stack)
        reserve, appended = leader._reserve, asyncio.Event()

        async def lost(event: Event, data: bytes) -> Any:
            got = await reserve(event, data)  # appended and proven; the answer never leaves
            appended.set()
            await asyncio.sleep(30)
            return got

        leader._reserve = lost  # type: ignore[method-assign]
        ledger = Ledger(port, verdict_timeout=5)
        outcome = await ledger.call(
            issue_credit_unreconciled,
            run_id="r-one",
            tool_call_id="c1",
            tenant_id="acme",
            arguments=ARGS,
        )
        assert appended.is_set() and outcome.status == "completed"
        assert service.effects() == 1
        await ledger.close()

        async def settled() -> list[str] | None:  # the outcome went direct: a batch later
            history = await stack.store.history("r-one:c1")
            return [h.event_type for h in history] if len(history) > 1 else None

        got = await until(settled, timeout=15, what="the outcome committed")
        assert got == ["call_reserved", "call_completed"]
