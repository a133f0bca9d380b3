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
