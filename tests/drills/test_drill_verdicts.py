"""The verdicts a drill's runtimes heard: written down whole, attributed to the right path, and
checked against the re-fold of the log.

A leader answers from memory, before anything is committed; the drill's check that each answer
is the log's rests on three things shown here: the record survives a worker killed mid-line,
the path a verdict is attributed to is the one that gave it (else the drill's leader count lies),
and a verdict that differs from the re-fold's in anything it holds is a violation naming its
event_id.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

from tests import builders as b
from tests.drills.evidence import call, failed, healthy
from tests.integration.procs import until
from tests.isolated import Isolated, running_stack
from toolledger.drill.checks import Refold, judge
from toolledger.drill.killpoints import KillPoints
from toolledger.drill.port import DirectPath, DrillPort
from toolledger.drill.verdicts import Heard, VerdictRecord, read_heard, verdict_form
from toolledger.events.models import Event
from toolledger.events.records import Verdict
from toolledger.leader.runtime_side.port import LeaderPort
from toolledger.settings import ProjectorSettings
from toolledger.wiring.leader import leader_port

CHECK = "every verdict a runtime heard is the re-fold's"


def _verdict(key: str, *, accepted: bool = True) -> Verdict:
    record = call(key, "completed", "cr_b")
    return Verdict(
        event_id=uuid.uuid4(),
        event_type="call_completed",
        key=key,
        run_id=record.run_id,
        accepted=accepted,
        reason="accepted" if accepted else "late_outcome",
        detail="",
        call=record,
    )


def _heard_and_refolded(*verdicts: Verdict) -> tuple[list[Heard], dict[str, dict[str, Any]]]:
    forms = [verdict_form(v) for v in verdicts]
    heard = [Heard(f["event_id"], "leader", f) for f in forms]
    return heard, {f["event_id"]: dict(f) for f in forms}


def test_a_verdict_a_runtime_heard_that_the_log_does_not_say_is_a_violation() -> None:
    """A leader (or a zombie leader, or a resend) that told a runtime "accepted" where the log's
    fold says "rejected" broke the ledger's word where no projection can see it: the check must
    name the event_id, and a verdict the log has no record of at all is as bad."""
    evidence = healthy()
    heard, refolded = _heard_and_refolded(_verdict("r1:s1"), _verdict("r1:s0r1"))
    evidence.heard = heard
    evidence.refold = Refold("abc", "abc", 4, [], verdicts=refolded)
    assert failed(evidence) == set()
    assert judge(evidence)[1].heard == {"leader": 2}

    flipped = heard[1].form | {"accepted": False}
    evidence.heard = [heard[0], Heard(heard[1].event_id, "leader", flipped)]
    assert failed(evidence) == {CHECK}
    detail = next(c.detail for c in judge(evidence)[0] if c.name == CHECK)
    assert heard[1].event_id in detail and "accepted True" not in detail
    assert "accepted False != True" in detail

    evidence.heard = heard
    only_first = {heard[0].event_id: refolded[heard[0].event_id]}
    evidence.refold = Refold("abc", "abc", 4, [], verdicts=only_first)
    assert failed(evidence) == {CHECK}
    assert heard[1].event_id in next(c.detail for c in judge(evidence)[0] if c.name == CHECK)


def test_the_state_a_verdict_left_behind_is_compared_but_not_how_its_payloads_travelled() -> None:
    """A result stored by reference (the re-fold's row) and the same result restored inline (what
    the runtime heard) are one verdict; another result under the same headline is not."""
    inline = _verdict("r1:s1")
    assert inline.call is not None and inline.call.result_json is not None
    digest = hashlib.sha256(inline.call.result_json.encode()).hexdigest()
    by_reference = inline.model_copy(
        update={"call": inline.call.model_copy(update={"result_json": "", "result_blob": digest})}
    )
    assert verdict_form(by_reference) == verdict_form(inline)
    other = inline.model_copy(
        update={"call": inline.call.model_copy(update={"result_json": '{"credit_id": "cr_x"}'})}
    )
    assert verdict_form(other)["state"] != verdict_form(inline)["state"]
    assert {k for k, v in verdict_form(other).items() if verdict_form(inline)[k] != v} == {"state"}


def test_the_verdict_file_keeps_every_whole_line_when_a_worker_dies_mid_line(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed while writing must not cost the lines before it, nor make the lines
    after it (another worker's) unreadable: a torn line is skipped, never misread."""
    path = tmp_path / "verdicts.jsonl"
    first, second = _verdict("r1:s0"), _verdict("r1:s1")
    VerdictRecord(path, "w1").write(first, "leader")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b'{"worker":"w2","via":"leader","event_id":"')  # died here
    os.close(fd)
    VerdictRecord(path, "w3").write(second, "direct")
    heard = read_heard(path)
    assert [(h.event_id, h.via) for h in heard] == [
        (str(first.event_id), "leader"),
        (str(second.event_id), "direct"),
    ]
    assert heard[0].form == verdict_form(first)


def _calls(run_id: str, n: int) -> list[Event]:
    events: list[Event] = []
    for i in range(n):
        reserved = b.reserved(run_id, f"c{i}", t=i)
        events += [reserved, b.completed(reserved, t=i + 0.5)]
    return events


async def _heard_on(settings: ProjectorSettings, path: Path, run_id: str) -> list[Heard]:
    """Reservations and outcomes through a drill port on `settings`; what it wrote down, once
    checked equal to the verdicts the projection committed for them."""
    async with running_stack(settings) as stack:
        inner = leader_port(DirectPath(stack), settings)
        assert isinstance(inner, LeaderPort)
        port = DrillPort(inner, KillPoints.disabled(), VerdictRecord(path))
        try:
            if settings.leader_listen != "off":

                async def led() -> bool:
                    found = await inner.directory.leaders()
                    return len([a for a in found.values() if a]) == settings.partitions

                await until(led, timeout=15, what="a leader registered for every partition")
            heard = [await port.append_and_await(e, 30) for e in _calls(run_id, 3)]
            ids = [v.event_id for v in heard]

            async def committed() -> dict[uuid.UUID, Verdict] | None:
                found = await stack.store.verdicts(ids)
                return found if len(found) == len(ids) else None

            stored = await until(committed, timeout=30, what="the projection's verdicts")
        finally:
            await inner.close()
    assert [verdict_form(stored[i]) for i in ids] == [verdict_form(v) for v in heard]
    return [h for h in read_heard(path) if h.form["key"].startswith(f"{run_id}:")]


async def test_each_verdict_is_written_down_with_the_path_that_answered_it(
    isolated: Isolated, tmp_path: Path
) -> None:
    """A drill counting the direct path's verdicts as the leader's would claim leaders it never
    reached: with a leader answering, every verdict is the leader's; with none registered the
    same calls go direct and are written down so. Either way what was heard is what the
    projection committed."""
    fast = isolated.settings(
        ProjectorSettings, verify_keys=b.KEYS, leader="auto", leader_timeout_ms=30_000
    )
    heard = await _heard_on(fast, tmp_path / "fast.jsonl", "r-fast")
    assert [h.via for h in heard] == ["leader"] * 6
    direct = fast.model_copy(update={"leader_listen": "off"})
    heard = await _heard_on(direct, tmp_path / "direct.jsonl", "r-direct")
    assert [h.via for h in heard] == ["direct"] * 6
