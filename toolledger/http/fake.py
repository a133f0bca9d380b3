"""A small Stripe-like payments API on a loopback port: it honours idempotency keys, and it can
be told to misbehave the ways real networks do. For tests, examples and drills of HTTP tools
(`toolledger.http`): a real TCP server, so a tool goes through httpx's real transport.

Pure standard library (asyncio streams and a minimal HTTP/1.1 parser, keep-alive included):

- `POST /v1/refunds` (`{"charge": "ch_1", "amount": 2500}`, header `Idempotency-Key`) makes a
  refund (an *effect*) and stores its answer under the key. The same key again gets the stored
  answer, byte for byte, with `Idempotent-Replayed: true`, for as long as the book keeps it
  (Stripe: 24 hours). A refund larger than what is left of the charge is a 400, stored like
  any answer.
- `GET /v1/charges/<id>` reads a charge: what was charged and what is refunded.

Where refunds and stored answers live is the fake's `book` (`RefundBook`): `MemoryBook` by
default (`refunds`, gone with the process), or one of the caller's, such as the drill's, which
keeps them in its billing database so that they outlive the runtimes sending to it and the
drill's checks can count them (`toolledger.drill.payments`).

`script` holds what to do with the next requests that reach an endpoint, one word each, used up
in order; once it is empty, `unscripted()` is asked (by default: nothing special):

| word          | the fake                                                                 |
|---------------|--------------------------------------------------------------------------|
| `drop`        | applies the refund (or replays it) and drops the connection unanswered   |
| `in_progress` | applies (or replays) it, but answers 409 "request in progress"           |
| `500`, `503`  | answers that status before looking at the key, and applies nothing      |
| `hold`        | keeps the request unanswered until `release()`                           |

`refuse()` stops listening and drops open connections (held requests too), so new connections
are refused;
`accept()` listens on the same port again. `requests` lists every request received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Answer", "FakePayments", "MemoryBook", "Received", "RefundBook", "answer_json"]

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Received:
    """One request as the fake saw it."""

    method: str
    path: str
    key: str | None
    body: bytes = b""


@dataclass(frozen=True)
class Answer:
    """What the fake answers: a status, a JSON body, and whether it is a stored one replayed."""

    status: int
    body: bytes
    replayed: bool = False


def answer_json(status: int, value: object) -> Answer:
    return Answer(status, json.dumps(value).encode())


class RefundBook(Protocol):
    """Where the fake keeps its charges, refunds and the answer it gave for each key."""

    def refund(self, key: str, request: Mapping[str, Any]) -> Answer:
        """Apply `request` once per `key` and store the answer; a key seen before gets its
        stored answer back, `replayed`, and applies nothing."""

    def charge(self, charge: str) -> Answer:
        """`GET /v1/charges/<charge>`'s answer."""


class MemoryBook:
    """Charges, refunds and answers in this process's memory."""

    def __init__(self, charges: Mapping[str, int] | None = None) -> None:
        self.charges = dict(charges or {"ch_1": 5000})
        self.refunds: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, Answer] = {}

    def refund(self, key: str, request: Mapping[str, Any]) -> Answer:
        stored = self.keys.get(key)
        if stored is not None:
            return Answer(stored.status, stored.body, replayed=True)
        answer = self.keys[key] = self._apply(request)
        return answer

    def _apply(self, request: Mapping[str, Any]) -> Answer:
        charge, amount = request["charge"], int(request["amount"])
        left = self.charges.get(charge, 0) - self._refunded(charge)
        if amount > left:
            return answer_json(
                400, {"error": f"amount {amount} exceeds the {left} left of {charge}"}
            )
        refund_id = f"re_{len(self.refunds) + 1}"
        self.refunds[refund_id] = {"id": refund_id, "charge": charge, "amount": amount}
        return answer_json(200, self.refunds[refund_id])

    def charge(self, charge: str) -> Answer:
        if charge not in self.charges:
            return answer_json(404, {"error": f"no charge {charge}"})
        return answer_json(
            200,
            {"id": charge, "amount": self.charges[charge], "refunded": self._refunded(charge)},
        )

    def _refunded(self, charge: str) -> int:
        return sum(int(r["amount"]) for r in self.refunds.values() if r["charge"] == charge)


class FakePayments:
    """The fake API. Its port is bound at construction, so its `url` is known before `start()`.

    `charges` seed the default `MemoryBook`; `book` replaces it (see the module docstring)."""

    def __init__(
        self,
        charges: dict[str, int] | None = None,
        *,
        book: RefundBook | None = None,
        unscripted: Callable[[], str] | None = None,
    ) -> None:
        self.memory = MemoryBook(charges)
        self.book: RefundBook = book if book is not None else self.memory
        self.unscripted = unscripted
        self.requests: list[Received] = []
        self.script: deque[str] = deque()
        self._released = asyncio.Event()
        self._sock = self._bind(0)
        self.port: int = self._sock.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def refunds(self) -> dict[str, dict[str, Any]]:
        """The refunds made, by id (of the memory book)."""
        return self.memory.refunds

    def posts(self) -> list[Received]:
        """The refund requests received, in order."""
        return [r for r in self.requests if r.method == "POST"]

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self._sock)

    async def refuse(self) -> None:
        """Stop listening and drop every open connection: new connections are refused."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            # Every connection's handler ends on its abort (a held one once released); wait for
            # them, so none outlives the server (Python 3.11's wait_closed does not).
            self.release()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            self._released = asyncio.Event()
            await self._server.wait_closed()
            self._server = None

    async def accept(self) -> None:
        """Listen on the same port again."""
        self._sock = self._bind(self.port)
        await self.start()

    def release(self) -> None:
        """Let held requests go on."""
        self._released.set()

    async def stop(self) -> None:
        self.release()
        await self.refuse()

    async def __aenter__(self) -> FakePayments:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @staticmethod
    def _bind(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(64)
        sock.setblocking(False)
        return sock

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, headers = _parse_head(head)
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                key = headers.get("idempotency-key")
                self.requests.append(Received(method, path, key, body))
                answer = await self._handle(method, path, key, body)
                if answer is None:
                    writer.transport.abort()  # applied, then the connection is gone
                    return
                writer.write(_response(answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            if handler is not None:
                self._handlers.discard(handler)
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, method: str, path: str, key: str | None, body: bytes) -> Answer | None:
        if method == "POST" and path == "/v1/refunds":
            return await self._refund(key, body)
        if method == "GET" and path.startswith("/v1/charges/"):
            return await self._charge(path.removeprefix("/v1/charges/"))
        return answer_json(404, {"error": f"no route {method} {path}"})

    def _word(self) -> str:
        if self.script:
            return self.script.popleft()
        return self.unscripted() if self.unscripted is not None else ""

    async def _refund(self, key: str | None, body: bytes) -> Answer | None:
        if key is None:
            return answer_json(400, {"error": "refunds need an Idempotency-Key header"})
        word = self._word()
        if word in ("500", "503"):
            return answer_json(int(word), {"error": "the payments service is having a moment"})
        if word == "hold":
            await self._released.wait()
        request = _refund_request(body)
        if request is None:
            return answer_json(400, {"error": 'a refund is {"charge": "<id>", "amount": <cents>}'})
        answer = self.book.refund(key, request)
        if word == "drop":
            return None
        if word == "in_progress":
            return answer_json(409, {"error": "a request with this Idempotency-Key is in progress"})
        return answer

    async def _charge(self, charge: str) -> Answer:
        word = self._word()
        if word in ("500", "503"):
            return answer_json(int(word), {"error": "the payments service is having a moment"})
        if word == "hold":
            await self._released.wait()
        return self.book.charge(charge)


def _refund_request(body: bytes) -> dict[str, Any] | None:
    """The refund `body` asks for, or None if it is not one."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    charge, amount = request.get("charge"), request.get("amount")
    if not isinstance(charge, str) or not isinstance(amount, int) or isinstance(amount, bool):
        return None
    return request


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 409: "Conflict"}


def _response(answer: Answer) -> bytes:
    reason = _REASONS.get(answer.status, "Error")
    head = [
        f"HTTP/1.1 {answer.status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(answer.body)}",
    ]
    if answer.replayed:
        head.append("Idempotent-Replayed: true")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + answer.body
