"""A large result must never hang a call that already took effect (issue 15, item 3).

Found by trying it: a tool returning a 2 MB string on Kafka + PostgreSQL. aiokafka refused the
record at once (`MessageSizeTooLargeError`), the runtime took that for "may have landed" and
resent it forever, and `ledger.call` never returned while the key stayed `started`. Payloads
over the inline threshold now travel by reference (a content-addressed blob in the ledger
store, written before the event that names it), and one that cannot be recorded at all is an
error naming the key and the limit, with the call `indeterminate`, never `started` forever.
Every scenario runs on the memory ledger and on Kafka + PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.contract.runtime_harness import (
    SIGNING_KEY,
    Harness,
    kafka_postgres_harness,
    memory_harness,
)
from tests.isolated import Isolated
from toolledger import (
    ToolCallIndeterminate,
    ToolContext,
    ToolFailedError,
    Toolset,
    write,
)
from toolledger.events.models import RunCheckpointed, RunStarted
from toolledger.events.payloads import PayloadLimits, PayloadUnavailable, digest_of, restore_call
from toolledger.projections.postgres import PostgresLedger
from toolledger.projections.replay import copy_blobs, replay
from toolledger.runtime.errors import ToolArgumentsTooLarge, ToolResultUnrecordable

#: Small limits, the same on both ledgers, so "over the maximum" needs no gigabytes.
LIMITS = PayloadLimits(inline_bytes=64 * 1024, max_bytes=3 * 1024 * 1024)

ran: Counter[str] = Counter()
big = Toolset("big")
TWO_MB = "x" * (2 * 1024 * 1024)


@big.tool(write())
async def export_report(rows: int, context: ToolContext) -> str:
    """Returns a report of `rows` MB (2 MB is the size that hung the call)."""
    ran["export_report"] += 1
    return "x" * (rows * 1024 * 1024)


@big.tool(write())
async def store_document(body: str, context: ToolContext) -> int:
    """Takes large arguments, returns their length."""
    ran["store_document"] += 1
    return len(body)


@big.tool(write())
async def refuse_loudly(context: ToolContext) -> None:
    """Refuses with a 2 MB error message."""
    ran["refuse_loudly"] += 1
    raise ToolFailedError("no: " + "e" * (2 * 1024 * 1024))


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


async def _call(h: Harness, rows: int = 2, call_id: str = "c1") -> object:
    async with asyncio.timeout(30):  # the failure this guards was a call that never returned
        return await h.ledger.call(
            export_report,
            run_id="r1",
            tool_call_id=call_id,
            tenant_id="acme",
            arguments={"rows": rows},
        )


class LargePayloadScenarios:
    async def refuse_blobs(self, h: Harness) -> None:
        """Make the ledger store refuse every new blob (not unreachable: it answers no)."""
        raise NotImplementedError

    async def test_a_result_the_blob_store_refuses_leaves_the_call_indeterminate(
        self, h: Harness
    ) -> None:
        """A refusal from the store is as permanent as a size limit: retrying it forever
        would hang the call again."""
        await self.refuse_blobs(h)
        with pytest.raises(ToolResultUnrecordable, match="refused") as raised:
            await _call(h)
        assert "r1:c1" in str(raised.value)
        record = await h.record("r1:c1", "indeterminate")
        assert record.error is not None and "refused" in record.error
        assert ran["export_report"] == 1

    async def test_a_2_mb_result_is_recorded_by_reference_and_returned(self, h: Harness) -> None:
        """The call that hung: it must return, be recorded completed, and replay from the
        ledger without running the tool again."""
        outcome = await _call(h)
        assert getattr(outcome, "value", None) == TWO_MB
        stored = await h.record("r1:c1", "completed")
        assert stored.result_json == "" and stored.result_blob == digest_of(
            json.dumps(TWO_MB).encode()
        )
        read = await h.ledger.read_call("r1:c1")
        assert read is not None and json.loads(read.result_json or "") == TWO_MB
        again = await h.new_ledger().call(
            export_report, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments={"rows": 2}
        )
        assert again.replayed and again.value == TWO_MB and ran["export_report"] == 1

    async def test_the_history_keeps_the_digest_and_a_tampered_blob_is_caught(
        self, h: Harness
    ) -> None:
        """The chain covers the digest, the digest covers the text: a blob altered in the
        store must fail loudly on read, never be served as the result."""
        await _call(h)
        stored = await h.record("r1:c1", "completed")
        completed = [e for e in await h.stack.store.history("r1:c1") if e.accepted][-1]
        assert json.loads(completed.event_json)["result_blob"] == stored.result_blob
        assert stored.result_blob is not None
        blobs = await h.stack.store.get_blobs([stored.result_blob])
        assert digest_of(blobs[stored.result_blob]) == stored.result_blob
        with pytest.raises(PayloadUnavailable, match="does not match its digest"):
            restore_call(stored, {stored.result_blob: b'"forged"'})

    async def test_a_result_over_the_maximum_leaves_the_call_indeterminate_at_once(
        self, h: Harness
    ) -> None:
        """A result that cannot be recorded must not hang the call or leave it started: the
        tool ran, so the call is unknown, and the error names the key and the limit."""
        with pytest.raises(ToolResultUnrecordable) as raised:
            await _call(h, rows=4)
        message = str(raised.value)
        assert "r1:c1" in message and str(LIMITS.max_bytes) in message
        assert "TOOLLEDGER_PAYLOAD_MAX_BYTES" in message
        assert "toolledger executions resolve r1:c1" in message
        record = await h.record("r1:c1", "indeterminate")
        assert record.error is not None and str(LIMITS.max_bytes) in record.error
        with pytest.raises(ToolCallIndeterminate):
            await _call(h, rows=4)
        assert ran["export_report"] == 1

    async def test_large_arguments_go_by_reference_and_too_large_ones_are_refused_unrun(
        self, h: Harness
    ) -> None:
        """Arguments are payloads too: 200 KB travel by reference; 4 MB are refused before
        anything is reserved, naming the limit."""
        body = "y" * 200_000

        async def store(call_id: str, text: str) -> Any:
            return await h.ledger.call(
                store_document,
                run_id="r1",
                tool_call_id=call_id,
                tenant_id="acme",
                arguments={"body": text},
            )

        assert (await store("c1", body)).value == 200_000
        stored = await h.record("r1:c1", "completed")
        assert stored.arguments_blob is not None and stored.arguments_json == ""
        read = await h.ledger.read_call("r1:c1")
        assert read is not None and json.loads(read.arguments_json) == {"body": body}
        assert (await store("c1", body)).replayed and ran["store_document"] == 1
        with pytest.raises(ToolArgumentsTooLarge, match=str(LIMITS.max_bytes)):
            await store("c2", "z" * (4 * 1024 * 1024))
        assert await h.stack.store.get_call("r1:c2") is None and ran["store_document"] == 1

    async def test_a_huge_error_message_is_cut_and_the_failure_recorded(self, h: Harness) -> None:
        """An error text is for people: cut, so the outcome is recorded rather than hung."""
        async with asyncio.timeout(30):
            outcome = await h.ledger.call(
                refuse_loudly, run_id="r1", tool_call_id="c1", tenant_id="acme", arguments={}
            )
        assert outcome.status == "failed"
        record = await h.record("r1:c1", "failed")
        assert record.error is not None and len(record.error) < 10_000
        assert "more characters not recorded" in record.error

    async def test_a_long_transcript_is_checkpointed_by_reference(self, h: Harness) -> None:
        """RunCheckpointed carries the whole transcript; a long run hit the same wall."""
        envelope = {"key": "r9", "run_id": "r9", "tenant_id": "acme"}
        assert (await h.append(RunStarted(**envelope))).accepted
        state = json.dumps([{"role": "user", "content": "w" * 500_000}])
        verdict = await h.append(RunCheckpointed(**envelope, expected_version=0, state_json=state))
        assert verdict.accepted, verdict.detail
        run = await h.stack.store.get_run("r9")
        assert run is not None and run.state_blob is not None and run.state_json == ""
        assert (await h.stack.commands.restored_run(run)).state_json == state


class TestMemoryLargePayloads(LargePayloadScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[Harness]:
        async with memory_harness(tmp_path, payload_limits=LIMITS) as h:
            yield h

    async def refuse_blobs(self, h: Harness) -> None:
        async def refuse(_blobs: object) -> None:
            raise asyncpg.CheckViolationError("new row violates check constraint")

        h.stack.store.put_blobs = refuse  # type: ignore[method-assign,assignment]


class TestKafkaPostgresLargePayloads(LargePayloadScenarios):
    @pytest.fixture
    async def h(self, tmp_path: Path, isolated: Isolated) -> AsyncIterator[Harness]:
        limits = {
            "payload_inline_bytes": LIMITS.inline_bytes,
            "payload_max_bytes": LIMITS.max_bytes,
        }
        async with kafka_postgres_harness(tmp_path, isolated, **limits) as h:
            yield h

    async def test_a_replay_folds_the_same_ledger_without_blobs_then_copies_them(
        self, h: Harness
    ) -> None:
        """Dropping the projection and replaying the log must give the same ledger; the log
        holds only digests, so the blobs are copied from the live store and checked."""
        await _call(h)
        live = await h.record("r1:c1", "completed")
        assert h.settings is not None and h.settings.database_url is not None
        schema = f"{h.settings.schema_name}_replay"
        fresh = PostgresLedger(
            h.settings.database_url, schema, verify_keys=SIGNING_KEY.verify_keys()
        )
        await fresh.start()
        try:
            states = [await h.stack.store.partition_state(p) for p in range(2)]
            targets = {s.partition: s.next_offset for s in states if s is not None}
            report = await replay(h.stack.events, fresh, targets=targets)
            assert report.replay_digest == await h.stack.store.digest()
            replayed = await fresh.get_call("r1:c1")
            assert replayed == live and live.result_blob is not None
            assert await fresh.get_blobs([live.result_blob]) == {}
            assert await copy_blobs(h.stack.store, fresh) == []
            blobs = await fresh.get_blobs([live.result_blob])
            assert json.loads(restore_call(live, blobs).result_json or "") == TWO_MB
        finally:
            await fresh.close()
            conn = await asyncpg.connect(h.settings.database_url)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()

    async def refuse_blobs(self, h: Harness) -> None:
        """A real refusal by PostgreSQL: a constraint no payload satisfies."""
        assert h.settings is not None and h.settings.database_url is not None
        conn = await asyncpg.connect(
            h.settings.database_url, server_settings={"search_path": h.settings.schema_name}
        )
        try:
            await conn.execute("ALTER TABLE payload_blobs ADD CONSTRAINT tiny CHECK (size < 10)")
        finally:
            await conn.close()


del LargePayloadScenarios
