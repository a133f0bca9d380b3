"""Importing the user's modules named on a command line (`--tools mypkg.tools`, `--app m:f`).

The processes that run user code (API, reconciler, resumer, `executions compensate`) find the
tools and hooks by importing a module by name, so the module must be importable from the
process: installed in its environment, or a package under the working directory, which is put
on `sys.path` as `python -m` and uvicorn do. A module that cannot be imported, or declares
nothing usable, stops the command at startup with `ModuleLoadError`, naming the option.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from toolledger.errors import ConfigError

__all__ = ["ModuleLoadError", "import_user_module"]


class ModuleLoadError(ConfigError, ValueError):
    """A module named by `--tools` or `--app` cannot be imported or declares nothing usable."""

    code = "module_load"


def import_user_module(name: str, option: str) -> ModuleType:
    """Import `name` (given as `option`), the working directory included in the search path."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModuleLoadError(
            f"{option} {name}: cannot import it ({exc}). The module must be importable by this "
            "process: installed in its environment, or a package under the working directory "
            f"({os.getcwd()})"
        ) from exc
