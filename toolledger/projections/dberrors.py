"""What a lost or failing PostgreSQL connection raises, as one tuple to catch.

asyncpg signals a dropped session in several unrelated ways: OSError from the socket,
PostgresError subclasses (`ConnectionDoesNotExistError`, an admin shutdown), InterfaceError for
a closed connection, and InternalClientError when the server's termination notice arrives in the
middle of an operation. Code that must survive a database restart catches all of them.
"""

from __future__ import annotations

import asyncpg

DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

#: SQLSTATE classes of errors that pass: a lost connection (08), the server shutting down or
#: starting (57), a resource running out (53), a transaction to retry (40).
_TRANSIENT_CLASSES = frozenset({"08", "57", "53", "40"})


def transient_database_error(exc: BaseException) -> bool:
    """Whether trying again later can succeed: the connection or the server, not the request."""
    if isinstance(exc, asyncpg.PostgresError):
        return str(getattr(exc, "sqlstate", "") or "")[:2] in _TRANSIENT_CLASSES
    return True
