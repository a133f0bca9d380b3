"""Restate side by side: a `restate-server` on free ports and the SDK service behind hypercorn.

The server (the npm package `@restatedev/restate-server-linux-x64`) runs from a fresh base
directory with 4 partitions (toolledger's benchmarks use 4) and its default durability (its
RocksDB WAL is fsynced); the service (`benchmarks/peers/restate_service.py`) runs in the peers'
own virtualenv, served by hypercorn, and is registered through the admin API. Invocations go
through the server's HTTP ingress, as a client would send them; a `ctx.run` step is durable
when the server acknowledged its journal entry: one record after the step.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import httpx

from benchmarks.peers import _procs
from benchmarks.peers._cpu import Parts
from benchmarks.peers._systems import System

PARTITIONS = 4


class Restate(System):
    name = "Restate"
    durable = "one journal entry after the step (`ctx.run`), acknowledged by the server"

    def __init__(self) -> None:
        super().__init__()
        self.home = Path(tempfile.mkdtemp(prefix="toolledger-peers-restate-"))
        self.server: asyncio.subprocess.Process | None = None
        self.sdk: asyncio.subprocess.Process | None = None
        self.http = httpx.AsyncClient(
            timeout=300, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)
        )
        self.ingress = ""

    async def start(self) -> None:
        ingress, admin, fabric, sdk = (_procs.free_port() for _ in range(4))
        env = {
            "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ingress}",
            "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{admin}",
            "RESTATE_BIND_ADDRESS": f"127.0.0.1:{fabric}",
            "RESTATE_DEFAULT_NUM_PARTITIONS": str(PARTITIONS),
            "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": "512MiB",
            "RESTATE_DISABLE_TELEMETRY": "true",
            "RESTATE_LOG_FILTER": "warn",
        }
        self.server = await _procs.start(
            [
                str(_procs.RESTATE_SERVER),
                "--base-dir",
                str(self.home / "data"),
                "--listen-mode",
                "tcp",
                "--no-logo",
            ],
            self.home / "server.log",
            env,
        )
        self.sdk = await _procs.start(
            [str(_procs.PYTHON), "benchmarks/peers/restate_service.py", str(sdk)],
            self.home / "sdk.log",
        )
        await _procs.until_listening(admin, self.server, "restate-server")
        await _procs.until_listening(sdk, self.sdk, "the Restate service")
        await self._admin_ready(admin)
        answer = await self.http.post(
            f"http://127.0.0.1:{admin}/deployments", json={"uri": f"http://127.0.0.1:{sdk}"}
        )
        answer.raise_for_status()
        self.ingress = f"http://127.0.0.1:{ingress}"
        for _ in range(300):  # the registration reaches the ingress a moment later
            probe = await self.http.post(f"{self.ingress}/Bench/steps", json=1)
            if probe.status_code == 200:
                self.asked += 1
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the Restate ingress never accepted a call: {probe.text}")

    async def _admin_ready(self, admin: int) -> None:
        for _ in range(600):
            try:
                if (await self.http.get(f"http://127.0.0.1:{admin}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("the Restate admin API never became healthy")

    async def _invoke(self, handler: str, n: int | None) -> object:
        url = f"{self.ingress}/Bench/{handler}"
        answer = await (self.http.post(url) if n is None else self.http.post(url, json=n))
        if answer.status_code != 200:
            raise RuntimeError(
                f"Restate {handler}({n}) answered {answer.status_code}: {answer.text}"
            )
        return answer.json()

    async def serial(self, n: int, label: str) -> list[float]:
        times = await self._invoke("serial", n)
        assert isinstance(times, list) and len(times) == n
        self.asked += n
        return [float(t) for t in times]

    async def concurrent(self, runs: int, calls: int, label: str) -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        done = await asyncio.gather(*(self._invoke("steps", calls) for _ in range(runs)))
        elapsed = loop.time() - started
        if done != [calls] * runs:
            raise RuntimeError(f"Restate: {runs} runs of {calls} steps reported {done}")
        self.asked += runs * calls
        return elapsed

    def parts(self) -> Parts:
        server, sdk = self.server, self.sdk
        assert server is not None and sdk is not None

        async def server_pid() -> list[int]:
            return [server.pid]

        async def sdk_pid() -> list[int]:
            return [sdk.pid]

        return {"server": server_pid, "SDK": sdk_pid}

    async def verify(self) -> str:
        ran = await self._invoke("ran", None)
        if ran != self.asked:
            raise RuntimeError(f"Restate: the step ran {ran} times for {self.asked} asked")
        return f"{self.asked} steps asked, {ran} ran in the service (every invocation answered)"

    async def close(self) -> None:
        try:
            for proc in (self.sdk, self.server):
                if proc is not None:
                    await _procs.stop(proc, grace=20)
        finally:
            await self.http.aclose()
            shutil.rmtree(self.home, ignore_errors=True)
