"""DBOS side by side: a worker process in the peers' virtualenv, its own database, dropped after.

DBOS is a library: the worker (`benchmarks/peers/dbos_worker.py`) is DBOS's runtime and its
client in one process, with its system database in the local PostgreSQL under a fresh name
(`peers_dbos_<id>`, created by DBOS on launch, dropped here at the end). The benchmark drives it
with one JSON command per line on its stdin. An `@DBOS.step()` is durable when its output row
is committed: one record after the step (DBOS also reads the step's slot before running it).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from benchmarks.peers import _procs
from benchmarks.peers._cpu import Parts
from benchmarks.peers._systems import System, backends


class Dbos(System):
    name = "DBOS"
    durable = "one row after the step (`operation_outputs`), read once before it"

    def __init__(self, database_url: str, pg: asyncpg.Connection[asyncpg.Record]) -> None:
        super().__init__()
        self.pg = pg
        self.database = f"peers_dbos_{uuid.uuid4().hex[:8]}"
        parts = urlsplit(database_url)
        self.url = urlunsplit(parts._replace(path=f"/{self.database}"))
        self.home = Path(tempfile.mkdtemp(prefix="toolledger-peers-dbos-"))
        self.worker: asyncio.subprocess.Process | None = None
        self.ran = 0

    async def start(self) -> None:
        self.worker = await _procs.start(
            [str(_procs.PYTHON), "benchmarks/peers/dbos_worker.py", self.url],
            self.home / "worker.log",
            pipes=True,
        )
        await self._read()

    async def _read(self) -> dict[str, Any]:
        assert self.worker is not None and self.worker.stdout is not None
        line = await asyncio.wait_for(self.worker.stdout.readline(), 300)
        if not line:
            log = (self.home / "worker.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the DBOS worker exited ({self.worker.returncode}):\n{log}")
        answer: dict[str, Any] = json.loads(line)
        self.ran = int(answer["ran"])
        return answer

    async def _ask(self, **command: object) -> dict[str, Any]:
        assert self.worker is not None and self.worker.stdin is not None
        self.worker.stdin.write(json.dumps(command).encode() + b"\n")
        await self.worker.stdin.drain()
        return await self._read()

    async def serial(self, n: int, label: str) -> list[float]:
        times = (await self._ask(op="serial", n=n))["times"]
        assert len(times) == n
        self.asked += n
        return [float(t) for t in times]

    async def concurrent(self, runs: int, calls: int, label: str) -> float:
        answer = await self._ask(op="concurrent", runs=runs, calls=calls)
        if answer["steps"] != runs * calls:
            raise RuntimeError(f"DBOS: {runs} runs of {calls} steps did {answer['steps']}")
        self.asked += runs * calls
        return float(answer["elapsed"])

    def parts(self) -> Parts:
        worker = self.worker
        assert worker is not None

        async def client() -> list[int]:
            return [worker.pid]

        async def postgres() -> list[int]:
            return await backends(self.pg, "datname = $1", self.database)

        return {"runtime + client": client, "PostgreSQL": postgres}

    async def verify(self) -> str:
        if self.ran != self.asked:
            raise RuntimeError(f"DBOS: the step ran {self.ran} times for {self.asked} asked")
        recorded = await self._count_outputs()
        if recorded != self.asked:
            raise RuntimeError(f"DBOS: {recorded} step outputs recorded for {self.asked} steps")
        return f"{self.asked} steps: each ran once and has its output row"

    async def _count_outputs(self) -> int:
        conn = await asyncpg.connect(self.url)
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(*) FROM dbos.operation_outputs WHERE function_name LIKE '%noop'"
                )
            )
        finally:
            await conn.close()

    async def close(self) -> None:
        try:
            if self.worker is not None and self.worker.returncode is None:
                assert self.worker.stdin is not None
                try:
                    self.worker.stdin.write(b'{"op": "stop"}\n')
                    await self.worker.stdin.drain()
                    await asyncio.wait_for(self.worker.wait(), 30)
                except (OSError, TimeoutError):
                    await _procs.stop(self.worker)
        finally:
            await self.pg.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            shutil.rmtree(self.home, ignore_errors=True)
