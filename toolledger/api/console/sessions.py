"""Console sessions: a random id in a cookie, everything else on the server, in memory.

An operator signs in by pasting a bearer token once. The browser then holds only a session id
(`toolledger_session`, HttpOnly so page scripts cannot read it, SameSite=Strict so no other
site's page can make the browser send it, Secure over HTTPS). The server keeps, per session,
the SHA-256 of the token (never the token), a CSRF token, and two clocks: a session ends after
`idle` without a request and after `lifetime` in any case. Every request re-checks the token by
its hash (`TokenStore.authenticate_digest`), so revoking or expiring the token ends the session
at its next request, and the role shown is always the token's current one.

Why memory and not a table: the console is served by one `toolledger api` process, and a
session is cheap to lose (the operator pastes the token again). Keeping it off PostgreSQL means
no session row can be read as a credential and nothing needs cleaning up. Behind a load balancer
with several API processes, pin a browser to one process (sticky sessions) or sign in again
after a switch; docs/console.md says so.

A session that is not signed in yet (the sign-in page's) carries a CSRF token too, so the
sign-in form is protected like every other form; signing in replaces it with a new session id,
so an id planted before sign-in is worth nothing after it.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from toolledger.events.models import utcnow

COOKIE = "toolledger_session"
#: How long a session lives without a request, and at most, by default.
IDLE = timedelta(minutes=30)
LIFETIME = timedelta(hours=8)
#: A session that never signs in (a sign-in page left open) lives this long.
ANONYMOUS_IDLE = timedelta(minutes=15)
#: Past this many live sessions the oldest are dropped, so opening sign-in pages in a loop
#: cannot grow the process without bound.
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Session:
    """One browser's session: `token_digest` is None until it signs in."""

    session_id: str
    csrf: str
    created_at: datetime
    seen_at: datetime
    token_digest: str | None = None

    @property
    def signed_in(self) -> bool:
        return self.token_digest is not None

    def csrf_matches(self, presented: str | None) -> bool:
        """Whether a form carried this session's CSRF token (compared in constant time)."""
        return presented is not None and secrets.compare_digest(presented, self.csrf)


class Sessions:
    """The server-side session store of one API process (see the module docstring)."""

    def __init__(
        self,
        *,
        idle: timedelta = IDLE,
        lifetime: timedelta = LIFETIME,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if idle <= timedelta(0) or lifetime <= timedelta(0):
            raise ValueError("console sessions need a positive idle timeout and lifetime")
        self.idle = idle
        self.lifetime = lifetime
        self.clock = clock
        # Least recently seen first: expiry and eviction only ever look at the front.
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def new(self, token_digest: str | None = None) -> Session:
        """A fresh session with a new id and CSRF token (signed in when given a digest)."""
        now = self.clock()
        self._prune(now)
        session = Session(
            session_id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            created_at=now,
            seen_at=now,
            token_digest=token_digest,
        )
        self._by_id[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id, its idle clock restarted; None if unknown or ended."""
        session = self._by_id.get(session_id) if session_id else None
        if session is None:
            return None
        now = self.clock()
        if self._expired(session, now):
            del self._by_id[session.session_id]
            return None
        session = replace(session, seen_at=now)
        self._by_id[session.session_id] = session
        self._by_id.move_to_end(session.session_id)
        return session

    def end(self, session_id: str) -> None:
        """Forget the session (sign-out, a rejected token); unknown ids are ignored."""
        self._by_id.pop(session_id, None)

    def _expired(self, session: Session, now: datetime) -> bool:
        idle = self.idle if session.signed_in else min(self.idle, ANONYMOUS_IDLE)
        return now - session.seen_at >= idle or now - session.created_at >= self.lifetime

    def _prune(self, now: datetime) -> None:
        """Drop expired sessions from the least recently seen end, then the oldest beyond the
        cap. A session expired in the middle is dropped when it is next asked for."""
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if not self._expired(oldest, now) and len(self._by_id) < MAX_SESSIONS:
                break
            self._by_id.popitem(last=False)
