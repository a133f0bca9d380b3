"""What a lost or failing PostgreSQL connection raises, as one tuple to catch.

asyncpg signals a dropped session in several unrelated ways: OSError from the socket,
PostgresError subclasses (`ConnectionDoesNotExistError`, an admin shutdown), InterfaceError for
a closed connection, and InternalClientError when the server's termination notice arrives in the
middle of an operation. Code that must survive a database restart catches all of them.

`database_errors()` is that tuple for code that also runs on the embedded ledger (the projector,
the verdict waiter, the runtime port): it names asyncpg's classes only once asyncpg is loaded,
since a process that never imported it cannot have raised one, so `Ledger.memory()` never
loads the driver. `DATABASE_ERRORS`, for code that only ever talks to PostgreSQL, imports it.
"""

from __future__ import annotations

import sys
from typing import Any

#: SQLSTATE classes of errors that pass: a lost connection (08), the server shutting down or
#: starting (57), a resource running out (53), a transaction to retry (40).
_TRANSIENT_CLASSES = frozenset({"08", "57", "53", "40"})

_ErrorTypes = tuple[type[BaseException], ...]
_loaded: _ErrorTypes | None = None


def _of(asyncpg: Any) -> _ErrorTypes:
    return (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


def database_errors() -> _ErrorTypes:
    """The errors of a lost or failing database session that this process can have raised."""
    global _loaded
    if _loaded is None:
        asyncpg = sys.modules.get("asyncpg")
        if asyncpg is None or not hasattr(asyncpg, "InternalClientError"):
            return (OSError,)
        _loaded = _of(asyncpg)
    return _loaded


def transient_database_error(exc: BaseException) -> bool:
    """Whether trying again later can succeed: the connection or the server, not the request."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is not None and isinstance(exc, asyncpg.PostgresError):
        return str(getattr(exc, "sqlstate", "") or "")[:2] in _TRANSIENT_CLASSES
    return True


def __getattr__(name: str) -> Any:
    if name == "DATABASE_ERRORS":
        import asyncpg

        return _of(asyncpg)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
