"""`toolledger analytics` turns facts into Prometheus metrics (real Kafka + PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import urllib.request
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from tests import builders as b
from tests.integration.procs import python_child
from tests.isolated import Isolated, child_env, running_stack
from toolledger.processors.analytics import WINDOW_S
from toolledger.settings import ProjectorSettings as Settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: A metric sample: its name and its sorted labels.
Sample = tuple[str, tuple[tuple[str, str], ...]]


def _scrape(port: int) -> dict[Sample, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_calls_by_status_and_the_per_minute_unknown_rate_are_exported(
    isolated: Isolated,
) -> None:
    """Analytics must count each call once in its current status (a call that moved from
    started to completed is no longer counted as started) and rate unknown calls per minute,
    from decided facts only: a rejected reservation counts nowhere."""
    settings = isolated.settings(Settings, verify_keys=b.KEYS)
    port = _free_port()
    env = {**os.environ, **child_env(settings)}
    analytics = ("-m", "toolledger", "analytics", "--metrics-port", str(port))
    async with running_stack(settings) as stack, python_child(*analytics, env=env) as proc:

        async def scraped(want: dict[Sample, float]) -> dict[Sample, float]:
            """The metrics once they show `want` (or as they are after 45 s)."""
            got: dict[Sample, float] = {}
            deadline = asyncio.get_running_loop().time() + 45
            while asyncio.get_running_loop().time() < deadline:
                if proc.returncode is not None:
                    _, err = await proc.communicate()
                    raise AssertionError(err.decode()[-8000:])
                with contextlib.suppress(OSError):
                    got = await asyncio.to_thread(_scrape, port)
                if all(got.get(k) == v for k, v in want.items()):
                    break
                await asyncio.sleep(0.2)
            return got

        tool = (("tenant", "acme"), ("tool", "billing.issue_credit"))
        runs = [b.reserved(f"run-{n}", "c1") for n in range(6)]
        for n, r in enumerate(runs):
            await stack.commands.append_and_await(r, 10)
            if n < 4:
                await stack.commands.append_and_await(b.completed(r), 10)
        await stack.commands.append_and_await(b.reserved("run-0", "c1"), 10)  # rejected
        completed = ("toolledger_calls", (("status", "completed"), *tool))
        started = ("toolledger_calls", (("status", "started"), *tool))
        got = await scraped({completed: 4.0, started: 2.0})
        assert (got.get(completed), got.get(started)) == (4.0, 2.0), got  # analytics caught up
        # The rate gauge shows the window (minute) the wall clock is in; the two indeterminate
        # outcomes happen in it, at one instant, with at least 10 s of it left: analytics is
        # caught up, so they reach the gauge within its refresh (a second) and a few hops.
        left = WINDOW_S - time.time() % WINDOW_S
        if left < 10:
            await asyncio.sleep(left + 0.1)
        window = int(time.time() // WINDOW_S)
        now = datetime.now(UTC)
        for r in runs[4:]:
            # rates are per minute of the request's own time: make these happen now
            unknown = b.indeterminate(r).model_copy(update={"occurred_at": now})
            await stack.commands.append_and_await(unknown, 10)
        want = {
            completed: 4.0,
            ("toolledger_calls", (("status", "indeterminate"), *tool)): 2.0,
            ("toolledger_indeterminate_per_minute", tool): 2.0,
        }
        got = await scraped(want)
        ours = {k: v for k, v in got.items() if k[0].startswith("toolledger_")}
        assert int(time.time() // WINDOW_S) == window or all(
            got.get(k) == v for k, v in want.items()
        ), f"the test outlived its rate window (over 10 s); got {ours}"
        assert all(got.get(k) == v for k, v in want.items()), ours
        assert got.get(started, 0.0) == 0.0
