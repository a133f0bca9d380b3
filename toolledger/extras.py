"""Which install extra provides what, and the error that names the one to install.

`pip install toolledger` is what an agent runtime needs: the ledger, its Kafka and PostgreSQL
adapters, the embedded ledger, the `toolledger` command and its demo. The server roles'
frameworks come with `pip install 'toolledger[server]'`: faust for the reconciler, the resumer
and analytics, FastAPI, uvicorn, Jinja2 and python-multipart for the operator API and console.
Code that needs one imports it through `missing_extra` so that a runtime-only install answers
`toolledger api` (or `from toolledger.api import create_app`) with the command to run, not with
`ModuleNotFoundError: No module named 'fastapi'`.
"""

from __future__ import annotations

import importlib.util
import sys

from toolledger.errors import ConfigError

#: What the faust processors import (reconciler, resumer, analytics).
PROCESSORS = ("faust",)
#: What the operator API and its console import.
API = ("fastapi", "uvicorn", "jinja2", "multipart")
#: What HTTP tools import (`toolledger.http`).
HTTP = ("httpx",)
#: The modules each extra brings, as imported (not as distributions are named).
EXTRAS: dict[str, tuple[str, ...]] = {"server": PROCESSORS + API, "http": HTTP}


class MissingExtra(ConfigError):
    """A feature needs an install extra that is not installed; the message says which.

    A `ConfigError`, so a command stopped by it exits 2: it cannot run as installed."""

    code = "missing_extra"

    def __init__(self, extra: str, module: str, needed_by: str) -> None:
        super().__init__(
            f"{needed_by} needs the `{extra}` extra ({module} is not installed): "
            f"pip install 'toolledger[{extra}]'"
        )
        self.extra = extra
        self.module = module


def _importable(module: str) -> bool:
    if module in sys.modules:  # faust's lazy module object has no __spec__ once imported
        return sys.modules[module] is not None  # None: blocked on purpose (a test does this)
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, needed_by: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise `MissingExtra` unless `modules` (default: every module of `extra`) are installed.
    Looks them up without importing them."""
    for module in EXTRAS[extra] if modules is None else modules:
        if not _importable(module):
            raise MissingExtra(extra, module, needed_by)


def installed(*modules: str) -> bool:
    """Whether every one of `modules` is installed (without importing them)."""
    return all(_importable(module) for module in modules)
