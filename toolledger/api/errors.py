"""What the operator service says when it cannot do what was asked.

Each error carries a stable `code` for programs (a decider reason such as `version_mismatch`,
or `not_found`, `invalid_cursor`, ...) and a message for people that says what was wrong and
what to do next. The API maps the classes to HTTP statuses (404, 422, 409, 503, 500); the CLI
maps them to exit codes.
"""

from __future__ import annotations

from datetime import datetime

from toolledger.events.records import CallRecord


class OperatorError(Exception):
    """A request the service cannot carry out; `code` is for programs, the message for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NotFound(OperatorError):
    """No such call for this operator's tenant."""


class InvalidRequest(OperatorError):
    """The request itself is wrong (an empty reason, a cursor this service did not issue)."""


class Conflict(OperatorError):
    """The ledger refused the decision; `record` is the call as it is now."""

    def __init__(
        self,
        code: str,
        message: str,
        record: CallRecord | None = None,
        resolvable_after: datetime | None = None,
    ) -> None:
        super().__init__(code, message)
        self.record = record
        self.resolvable_after = resolvable_after


class Unavailable(OperatorError):
    """Kafka, the projector or PostgreSQL did not answer in time; the command may still apply."""


class Misconfigured(OperatorError):
    """This process's setup contradicts the ledger's (its signing key is not one it accepts)."""


def http_status(exc: OperatorError) -> int:
    """The HTTP status the API and the console answer `exc` with."""
    match exc:
        case NotFound():
            return 404
        case InvalidRequest():
            return 422
        case Conflict():
            return 409
        case Unavailable():
            return 503
        case _:
            return 500
