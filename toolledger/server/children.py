"""The roles `toolledger server` runs as child processes, and how it stops them.

The reconciler and the resumer are faust workers, and they cannot share the server's process.
faust's `Worker` owns the process it runs in (its signal handlers, its event loop's shutdown,
its logging), so two of them, or one beside uvicorn, fight over the same process. More to the
point, both run the host's code (reconcile hooks, the resume hook that drives an agent), and
processes that run user code hold no private key (docs/security.md, "Roles"): in the server's
own process the operator API holds the signing key. So each runs as `toolledger reconciler` /
`toolledger resumer`, exactly the command an operator can run alone, with an environment
stripped of what only the projector and the operator roles read.

The server supervises them itself, so it stays one thing to deploy and stop:

- a child's output goes to the server's stdout and stderr (its lines carry its own pid);
- on Linux the kernel SIGKILLs a child whose server died without stopping it (SIGKILL, not
  SIGTERM: a faust worker told to stop while it is still starting can hang there, and with
  its server gone nobody would escalate; the facts it had not committed are redelivered);
- `stop()` sends SIGTERM to each child's pid, waits, and sends SIGKILL to the pid of one
  that has not exited in time; nothing is ever signalled by name;
- a child that exits while the server runs stops the whole server, with the child's own exit
  status (`ExitStatus`), so the orchestrator that restarts the server sees why.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolledger.cli.entry import CommandFailed
from toolledger.errors import ExitStatus
from toolledger.settings import OperatorSettings, ProjectorSettings, Settings

log = logging.getLogger("toolledger.server")

#: Seconds a child has to exit after SIGTERM before it is sent SIGKILL.
STOP_TIMEOUT_S = 20.0
_PR_SET_PDEATHSIG = 1


def role_variables(*roles: type[Settings]) -> frozenset[str]:
    """The `TOOLLEDGER_*` variables only `roles` read (not the shared block): what a child
    running user code must not inherit. Derived from the settings classes, so a new secret
    setting is stripped without anyone remembering to list it."""
    shared = set(Settings.model_fields)
    names: set[str] = set()
    for role in roles:
        for name, info in role.model_fields.items():
            if name in shared:
                continue
            alias = info.validation_alias
            names.add(alias if isinstance(alias, str) else f"TOOLLEDGER_{name.upper()}")
    return frozenset(names)


#: What the reconciler and the resumer never see: the private signing keys, the metrics
#: scrape token, the projectors' public key set (they verify nothing).
PRIVATE_TO_SERVER = role_variables(OperatorSettings, ProjectorSettings)


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the projector's and the operator's own settings."""
    return {k: v for k, v in environ.items() if k not in PRIVATE_TO_SERVER}


def _dies_with(server: int) -> Callable[[], None]:
    """For the child, before exec: SIGKILL when the server's process ends (Linux only), so a
    SIGKILLed server leaves no processor behind still consuming facts. A server that died
    before the call was made is caught by the parent check after it."""

    def arm() -> None:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != server:
            os._exit(1)

    return arm


@dataclass
class Child:
    """One role's process."""

    role: str
    process: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to this pid unless the process was already reaped."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)


def exit_of(child: Child, code: int) -> tuple[str, ExitStatus]:
    """What a child's unrequested exit means for the server: a sentence and a status.

    A child's own status passes through (2: its options or settings; 3: a service did not
    answer; 4: the log is not the ledger's). A child that ends with 0, or from a signal the
    server did not send, is still a role that stopped, so the answer is no (1).
    """
    try:
        status = ExitStatus(code)
    except ValueError:
        status = ExitStatus.NO
    if status is ExitStatus.OK or code < 0:
        status = ExitStatus.NO
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return (
        f"the {child.role} (pid {child.pid}) {how}; every role was stopped (its own error is "
        "on stderr above)",
        status,
    )


class Children:
    """Starts the child roles and stops every one of them by pid."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._env = child_environment(os.environ if environ is None else environ)
        self.started: list[Child] = []

    async def _spawn(self, args: Sequence[str], **streams: Any) -> asyncio.subprocess.Process:
        """`python -m toolledger <args>` with this interpreter and the children's environment."""
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolledger",
            *args,
            env=self._env,
            stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=_dies_with(os.getpid()) if sys.platform == "linux" else None,
            **streams,
        )

    async def start(self, role: str, args: Sequence[str]) -> Child:
        """`python -m toolledger <args>`, its output the server's."""
        process = await self._spawn(args)
        child = Child(role, process)
        self.started.append(child)
        log.info("started the %s (pid %d): toolledger %s", role, child.pid, " ".join(args))
        return child

    async def check(self, option: str, args: Sequence[str], timeout: float = 60.0) -> None:
        """Run `python -m toolledger <args>` to its end, as a child would run (this user code is
        imported there, never in the server); `CommandFailed` naming `option` if it fails."""
        process = await self._spawn(
            args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        try:
            _, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise CommandFailed(
                f"{option}: checking it took over {timeout:g}s; nothing was started",
                ExitStatus.USAGE,
            ) from None
        if process.returncode:
            said = err.decode(errors="replace").strip().splitlines()
            why = said[-1].removeprefix(f"toolledger {args[0]}: ") if said else "no reason given"
            raise CommandFailed(f"{option}: {why}; nothing was started", ExitStatus.USAGE)

    async def first_exit(self) -> tuple[Child, int]:
        """The first child to exit, with its status (waits forever when there is none)."""
        waits = {asyncio.ensure_future(c.process.wait()): c for c in self.started}
        if not waits:
            await asyncio.Event().wait()
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        first = next(iter(done))
        return waits[first], first.result()

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to every running child; SIGKILL to the pid of any not gone `timeout` s later."""
        for child in self.started:
            child.signal(signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + timeout
        for child in self.started:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            try:
                await asyncio.wait_for(child.process.wait(), left)
            except TimeoutError:
                log.warning(
                    "the %s (pid %d) did not stop in %gs; killing it",
                    child.role,
                    child.pid,
                    timeout,
                )
                child.signal(signal.SIGKILL)
                await child.process.wait()
