"""`toolledger server`: every server role for the partitions this process owns, in one command.

In this process: the projector (ownership through PostgreSQL advisory locks, exactly as
`toolledger projector`) and the operator API with its console on the same ledger stack, so the
API's `/readyz` reports this very projector (a halted partition, a stopped projector). As child
processes (`toolledger.server.children` says why): the reconciler, when `--tools` names the
modules declaring the tools, and the resumer, when `--resume-app` names the resume hook.

Each role reads its own settings (`toolledger.settings`) and all of them are read, with the
tools imported, the resume hook loaded (in a child process without the keys, as the resumer
will load it: the hook's module is not the API's to import) and the port bound, before anything
starts, so a bad setting stops startup with the error that names it and nothing half-started to
clean up. Several servers share the work as the single roles do: the projectors split or stand
by per `TOOLLEDGER_PROJECTOR_OWNERSHIP`, the processors share the facts partitions through
their consumer groups, the APIs are stateless.

Stopping: SIGTERM or SIGINT stops the API, then the children (SIGTERM to each pid, SIGKILL to
one that hangs), then the projector; the server then exits 0. If any role stops on its own,
the server stops the others and exits with the exit status that role's error means
(`toolledger.errors.ExitStatus`): one role down is the whole server down, for the orchestrator
to restart, never a server that looks alive and projects nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from toolledger.api.app import create_app
from toolledger.api.closing import close_stack
from toolledger.api.compensation import load_tools
from toolledger.cli.entry import CommandFailed
from toolledger.errors import ExitStatus
from toolledger.projections.gc_pause import settle_collector
from toolledger.projections.health import ProjectorHealth, log_status
from toolledger.server.children import Children, exit_of
from toolledger.settings import OperatorSettings, ProjectorSettings, Settings, load_settings
from toolledger.wiring.stack import LedgerStack

log = logging.getLogger("toolledger.server")

#: Seconds the API has to finish its requests in flight once the server stops.
API_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    tools: tuple[str, ...] = ()
    resume_app: str | None = None
    status_every: float = 30.0
    log_level: str = "info"


class _Web(uvicorn.Server):
    """uvicorn without its own signal handling: the server stops it (`should_exit`) after
    deciding the order roles stop in, and no signal is re-raised once it has."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """The API's listening socket, bound before any role starts (a port in use is a usage
    error naming `--port`, not a half-started server)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CommandFailed(
            f"cannot listen on {host}:{port} ({exc.strerror}): choose another --port or --host",
            ExitStatus.USAGE,
        ) from exc
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _child_args(options: ServerOptions) -> list[tuple[str, list[str]]]:
    roles: list[tuple[str, list[str]]] = []
    if options.tools:
        roles.append(("reconciler", ["reconciler", *(f"--tools={m}" for m in options.tools)]))
    else:
        log.warning("no --tools given: not running the reconciler (unknown calls wait for you)")
    if options.resume_app:
        roles.append(("resumer", ["resumer", "--app", options.resume_app]))
    else:
        log.warning("no --resume-app given: not running the resumer (paused runs stay paused)")
    return roles


async def serve(options: ServerOptions) -> None:
    """Run every role until SIGTERM or SIGINT (returns) or until one stops (raises)."""
    projecting = load_settings(ProjectorSettings)
    projecting.require_services()
    projecting.require_verify_keys()
    operating = load_settings(OperatorSettings)
    operating.require_signing_key()
    load_settings(Settings)  # the children's block, validated here so they cannot fail on it
    registry = load_tools(options.tools) if options.tools else None
    children = Children()
    if options.resume_app:  # imported in a child without the keys, as the resumer will
        resume = ["resumer", "--app", options.resume_app, "--check"]
        await children.check(f"--resume-app {options.resume_app}", resume)
    sock = listen(options.host, options.port)
    try:
        stack = await LedgerStack.connect(projecting, run_projector=True)
    except BaseException:
        sock.close()
        raise
    web: _Web | None = None
    tasks: list[asyncio.Task[object]] = []
    try:
        settle_collector()  # as `toolledger projector`
        for role, args in _child_args(options):
            await children.start(role, args)
        assert stack.projector is not None
        health = ProjectorHealth(stack.projector, stack.events)
        app = create_app(stack, operating, tools=registry, health=health)
        web = _Web(uvicorn.Config(app, log_level=options.log_level, lifespan="on"))
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        api = asyncio.ensure_future(web.serve(sockets=[sock]))
        projection = asyncio.ensure_future(
            log_status(health, stack.projector_task, options.status_every)
        )
        exited = asyncio.ensure_future(children.first_exit())
        asked = asyncio.ensure_future(stopping.wait())
        tasks = [api, projection, exited, asked]
        log.info(
            "serving the API and the console on http://%s:%d (console at /console)",
            options.host,
            options.port,
        )
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if stopping.is_set():
            log.info("stopping every role")
            return
        if projection.done():
            projection.result()  # the projector's own error, mapped to its exit status
            raise CommandFailed("the projector stopped on its own", ExitStatus.NO)
        if exited.done():
            raise CommandFailed(*exit_of(*exited.result()))
        raise CommandFailed("the API stopped on its own (its error is logged above)", ExitStatus.NO)
    finally:
        await _stop(web, tasks, children, stack)
        sock.close()


async def _stop(
    web: _Web | None,
    tasks: list[asyncio.Task[object]],
    children: Children,
    stack: LedgerStack,
) -> None:
    """API first (no new operator commands), then the children, then the projector."""
    api = tasks[0] if tasks else None
    if web is not None and api is not None:
        web.should_exit = True
        done, _ = await asyncio.wait({api}, timeout=API_STOP_TIMEOUT_S)
        if not done:
            web.force_exit = True
            await asyncio.wait({api}, timeout=API_STOP_TIMEOUT_S)
    await children.stop()
    for task in tasks[1:]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close_stack(stack)
