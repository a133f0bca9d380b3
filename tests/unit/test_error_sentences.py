"""Messages that embed another message end its sentence once: a cause that already ends with a
period must not leave "..". The not-attempted error read "...once PostgreSQL is reachable..
Its reservation is being abandoned", because the cause's own period was kept and another added.
"""

from __future__ import annotations

import pytest

from toolledger.errors import LedgerUnavailable
from toolledger.integrations._common import failed_text
from toolledger.runtime.errors import ToolCallFailed, not_attempted

CAUSES = ["cannot read r1:c1 (timeout); Try again once PostgreSQL is reachable.", "card declined"]


@pytest.mark.parametrize("cause", CAUSES)
def test_the_not_attempted_message_ends_its_cause_once(cause: str) -> None:
    message = str(not_attempted("billing.issue_credit", "r1:c1", LedgerUnavailable(cause)))
    assert ".." not in message
    assert "reachable. Its reservation" in message or "declined. Its reservation" in message


@pytest.mark.parametrize("cause", [*CAUSES, None])
def test_failure_messages_end_their_cause_once(cause: str | None) -> None:
    for not_sent in (True, False):
        failed = ToolCallFailed(
            key="r1:c1", tool="billing.issue_credit", error=cause, not_attempted=not_sent
        )
        assert ".." not in str(failed)
        told = failed_text("billing.issue_credit", "r1:c1", cause, may_retry=not_sent)
        assert ".." not in told
