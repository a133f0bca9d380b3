"""`toolledger projector --health-port`: `/readyz`, `/healthz` and `/metrics` of a projector
that runs alone, without the operator API (`toolledger server` serves them from the API).

A projector process is a server role, and a halted partition, or one whose owner stopped
renewing its lease, must show in the `/readyz` of any process that projects
(`toolledger.projections.health`), so an orchestrator's readiness probe and Prometheus can see
it without reading logs. The base install has no web framework, and these
three read-only answers do not need one: this is a few lines of HTTP/1.1 on asyncio streams,
one request per connection.

`/metrics` serves the process's default Prometheus registry: the projector's per-partition
gauges and process metrics, nothing per tenant, so it needs no scrape token (the API's, which
counts every tenant's calls, does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from toolledger.projections.health import ProjectorHealth, lag_checks, problems
from toolledger.projections.leases import lease_checks, lease_problems

#: Longest request line and headers read before the connection is dropped.
_MAX_REQUEST_BYTES = 8192


class HealthServer:
    """Answers `/healthz`, `/readyz` and `/metrics` for one projector."""

    def __init__(self, health: ProjectorHealth, task: asyncio.Task[None]) -> None:
        self.health = health
        self.task = task
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._answer, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def readiness(self) -> tuple[int, bytes, str]:
        leases = await self.health.leases()
        trouble = problems(self.health.projector) + lease_problems(leases)
        if self.task.done():
            trouble.insert(0, "this process's projector stopped")
        if trouble:
            body = {"error": {"code": "not_ready", "message": "; ".join(trouble)}}
            return 503, json.dumps(body).encode(), "application/json"
        checks = {**lag_checks(self.health), **lease_checks(leases)}
        ready = {"status": "ready", "checks": checks}
        return 200, json.dumps(ready).encode(), "application/json"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return
        method, _, rest = head[:_MAX_REQUEST_BYTES].decode("latin-1").partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method != "GET":
            status, body, kind = 405, b"only GET\n", "text/plain"
        elif path == "/healthz":
            status, body, kind = 200, b'{"status": "ok"}', "application/json"
        elif path == "/readyz":
            status, body, kind = await self.readiness()
        elif path == "/metrics":
            self.health.update_gauges()
            await self.health.leases()
            status, body, kind = 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST
        else:
            status, body, kind = 404, b"/healthz, /readyz or /metrics\n", "text/plain"
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Unavailable")
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
