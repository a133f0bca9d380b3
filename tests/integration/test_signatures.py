"""Operator signatures against real Kafka and PostgreSQL: the fold depends on the log and the
public key set alone, and only the API's private key can make a decision (issue 15, 1-2)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import pytest

from tests import builders as b
from tests.integration.procs import run_toolledger
from tests.isolated import Isolated, child_env
from toolledger import Ledger, Settings, load_settings
from toolledger.errors import ExitStatus
from toolledger.events.codec import encode
from toolledger.events.models import CallApproved, CallResolved, OperatorEvent
from toolledger.events.signing import SigningKey, VerifyKeys, sign
from toolledger.settings import ProjectorSettings
from toolledger.wiring.stack import LedgerStack

#: An operator key rolled out after k1 (the builders' key): its id is new to old projectors.
K2 = SigningKey.from_seed("k2", b"the second operator signing key!")


@pytest.fixture
def shared(isolated: Isolated) -> dict[str, Any]:
    """The settings every role here shares: this test's schema and topics."""
    return isolated.connection()


async def _projecting(shared: dict[str, Any], *keys: SigningKey) -> LedgerStack:
    public = VerifyKeys({k.key_id: k.public_bytes() for k in keys})
    return await LedgerStack.connect(
        ProjectorSettings(**shared, verify_keys=public), run_projector=True
    )


async def _eventually(check: Any, what: str, tries: int = 300) -> None:
    for _ in range(tries):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting until {what}")


def _cli(
    shared: dict[str, Any], verify: str | None, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    env.update({**child_env(Settings(**shared)), "COLUMNS": "250"})
    if verify is not None:
        env["TOOLLEDGER_VERIFY_KEYS"] = verify
    return run_toolledger(env, *args)


def _resolution(r: Any, key: SigningKey) -> CallResolved:
    return sign(b.resolved(r, 2, t=120, signed=False), key)


async def test_an_unknown_key_id_halts_its_partition_until_the_public_key_is_deployed(
    shared: dict[str, Any], pg_dsn: str, replicas: list[str]
) -> None:
    """A resolve signed with a key id the projector lacks must not be rejected (a replay that
    has the key would accept it, and the two would disagree, as in the issue): its partition
    halts naming the key, and a projector given the public key applies it and what follows."""
    old = await _projecting(shared, b.SIGNING_KEY)
    r = b.reserved("rotated", "c1", timeout=10)
    after = b.reserved("rotated", "c2", t=130)
    resolve = _resolution(r, K2)
    try:
        for event in (r, b.indeterminate(r, t=1)):
            assert (await old.commands.append_and_await(event, 10)).accepted
        position = await old.commands.append(resolve, 10)
        await old.commands.append(after, 10)
        projector = old.projector
        assert projector is not None
        await _eventually(
            lambda: asyncio.sleep(0, position.partition in projector.stats.halted),
            "the partition halts",
        )
        halted = projector.stats.halted[position.partition]
        assert "'k2'" in halted and "Deploy keys before signers" in halted
        assert "TOOLLEDGER_VERIFY_KEYS" in halted
        assert await old.store.verdicts([resolve.event_id]) == {}
        record = await old.store.get_call(r.key)
        assert record is not None and record.status == "indeterminate"
        assert await old.store.get_call(after.key) is None
    finally:
        await old.close()

    new = await _projecting(shared, b.SIGNING_KEY, K2)
    try:
        await _eventually(
            lambda: new.store.get_call(after.key), "the events after the halt are applied"
        )
        verdict = (await new.store.verdicts([resolve.event_id]))[resolve.event_id]
        assert (verdict.accepted, verdict.reason) == (True, "accepted")
        record = await new.store.get_call(r.key)
        assert record is not None and (record.status, record.settled_by) == ("failed", "operator")
    finally:
        await new.close()

    both = f"{b.SIGNING_KEY.public_setting()},{K2.public_setting()}"
    replicas += [f"{shared['schema_name']}_r", f"{shared['schema_name']}_s"]
    replayed = _cli(shared, both, "replay", "--into", replicas[0], "--verify")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "identical" in replayed.stdout
    assert "k1 (" in replayed.stdout and "k2 (" in replayed.stdout
    lacking = _cli(shared, b.SIGNING_KEY.public_setting(), "replay", "--into", replicas[1])
    assert lacking.returncode == ExitStatus.LOG_MISMATCH, lacking.stdout + lacking.stderr
    assert "Deploy keys before signers" in lacking.stderr


async def test_a_runtime_with_full_topic_access_cannot_get_an_approval_or_a_resolution_accepted(
    shared: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime can append any bytes to the events topic. What it must not be able to do is
    make an operator's decision: it holds no private key, even when the API's key is in its
    environment, and every decision it can construct is rejected or (for a key id of its
    own) halts the partition, which is a denial of service an operator sees, never a decision
    taken. What is asserted: the records stay undecided and no operator event is accepted."""
    projector = await _projecting(shared, b.SIGNING_KEY)
    monkeypatch.setenv("TOOLLEDGER_SIGNING_KEYS", b.SIGNING_KEY.setting())
    runtime_settings = load_settings(**shared)
    assert type(runtime_settings) is Settings
    assert not any(isinstance(v, SigningKey) for v in dict(runtime_settings).values())
    runtime = await Ledger.connect(runtime_settings)
    try:
        assert runtime.embedded_signing_key is None
        assert not [v for v in vars(runtime).values() if isinstance(v, SigningKey)]
        events = runtime.stack.events  # full write access to the topic
        gated = b.reserved("forger", "gated", requires_approval=True)
        unknown = b.reserved("forger", "unknown", timeout=10)
        other = b.reserved("forger", "other", requires_approval=True)
        for event in (gated, unknown, b.indeterminate(unknown, t=1), other):
            assert (await runtime.stack.commands.append_and_await(event, 10)).accepted
        # A real decision by the API, on another call: its signature is public on the topic.
        genuine = b.approved(other, 1)
        assert (await projector.commands.append_and_await(genuine, 10)).accepted

        guessed = SigningKey.generate(b.KEY_ID)  # the API's key id, a key of the runtime's own

        def approval() -> CallApproved:  # a new event_id each time: each is a new request
            return b.approved(gated, 1, signed=False)

        attempts: list[tuple[OperatorEvent, str]] = [
            (approval(), "unsigned"),
            (sign(approval(), guessed), "bad_signature"),
            (approval().model_copy(update={"signature": genuine.signature}), "bad_signature"),
            (_resolution(unknown, guessed), "bad_signature"),
            (
                b.resolved(unknown, 2, t=120, signed=False).model_copy(
                    update={"signature": genuine.signature}
                ),
                "bad_signature",
            ),
        ]
        for attempt, reason in attempts:
            await events.append(attempt.run_id, encode(attempt))
            verdict = await projector.waiter.wait(attempt.event_id, 10)
            assert (verdict.accepted, verdict.reason) == (False, reason)

        own = _resolution(unknown, SigningKey.generate("runtime-made"))
        position = await events.append(own.run_id, encode(own))
        assert projector.projector is not None
        stats = projector.projector.stats
        await _eventually(
            lambda: asyncio.sleep(0, position.partition in stats.halted),
            "the partition halts on the runtime's own key id",
        )
        assert await projector.store.verdicts([own.event_id]) == {}
        for key, status in ((gated.key, "awaiting_approval"), (unknown.key, "indeterminate")):
            record = await projector.store.get_call(key)
            assert record is not None and record.status == status
        accepted = [
            h
            for key in (gated.key, unknown.key)
            for h in await projector.store.history(key)
            if h.actor.startswith("operator:") and h.accepted
        ]
        assert accepted == []
    finally:
        await runtime.close()
        await projector.close()


async def test_a_projector_refuses_to_start_without_keys_or_with_keys_that_lost_a_registered_one(
    shared: dict[str, Any],
) -> None:
    """A projector without public keys would reject every decision a better-configured replay
    accepts; one that dropped a key another projector verified with would halt partitions it
    takes over. Both must stop at startup and name TOOLLEDGER_VERIFY_KEYS."""
    bare = _cli(shared, None, "projector")
    assert bare.returncode == 2, bare.stdout + bare.stderr
    assert "TOOLLEDGER_VERIFY_KEYS" in bare.stderr
    first = await _projecting(shared, b.SIGNING_KEY)
    await first.close()
    rebound = SigningKey.from_seed(b.KEY_ID, b"another key under the old key id")
    for keys, problem in (
        (K2.public_setting(), "missing"),
        (f"{rebound.public_setting()},{K2.public_setting()}", "another public key"),
    ):
        refused = _cli(shared, keys, "projector")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "TOOLLEDGER_VERIFY_KEYS" in refused.stderr and problem in refused.stderr
