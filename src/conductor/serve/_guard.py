"""Connections a client cannot hold: time-outs on reading a request, and a cap.

uvicorn's h11 protocol closes an idle keep-alive connection (``timeout_keep_alive``)
and, with ``limit_concurrency``, answers 503 once too many are open, but only after a
request's headers are in.  It has no time-out on reading a request: a connection that
sends half a request line and then nothing (or a byte now and then, keeping it out of
the keep-alive time-out) stays open for ever, and about a thousand of them spend the
process's file descriptors, so that nobody can connect, no token needed.
:class:`GuardedH11Protocol` is uvicorn's h11 protocol with what it lacks:

- a header time-out: a request's headers must be complete ``header_timeout_s`` after
  the connection opened, or after that request's first byte on a kept-alive
  connection; else the connection gets 408 and is closed;
- a body time-out: the body must be in ``body_timeout_s`` after the headers; else the
  connection is closed (the app sees its client leave);
- a request h11 cannot read gets 400 in OpenAI's error shape, as every other refusal;
- a cap of ``max_connections`` open at once, below the default limit of 1,024 file
  descriptors.  A connection beyond it closes the connection that has waited longest
  without a request in progress (one still sending headers, or idle between
  requests), so that a flood of slow connections cannot shut out a client that sends
  its request at once, and ``/health`` keeps answering while they last.  Where every
  connection has a request in progress, the new one gets 503 and is closed.

:func:`guarded_protocol` makes the class for one server (its limits and its list of
waiting connections); it is given to uvicorn's ``Config(http=...)``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import UsageError
from ._protocol import error_body
from ._settings import ServeSettings

__all__ = ["ACCEPT_BURST", "GuardedH11Protocol", "guarded_protocol"]

#: The listening socket's backlog, which is also how many connections asyncio accepts
#: in one go before any of them reaches the cap (uvicorn's 2,048 would take a flood of
#: connections past 1,024 file descriptors before the cap could close one).
ACCEPT_BURST = 128

#: File descriptors kept for what is not a client's connection: the clients of the
#: pool's providers, the cache, the records file, the interpreter's own.
_FD_RESERVE = 128


def _raw_response(
    status: str, message: str, code: str, extra: str = "", kind: str = "server_error"
) -> bytes:
    """A whole response with an error body in OpenAI's shape, written to the socket
    directly, where no request reached the app."""
    body = json.dumps(error_body(message, type=kind, code=code)).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


#: What a connection beyond the cap gets when no waiting connection can make room.
_BUSY = _raw_response(
    "503 Service Unavailable",
    "the server has as many connections open as it takes; retry in a moment",
    "too_many_connections",
    "retry-after: 1\r\n",
)
#: What a connection gets that did not send its request's headers in time.
_SLOW = _raw_response(
    "408 Request Timeout",
    "the request's headers did not arrive in time",
    "request_timeout",
    kind="invalid_request_error",
)
#: What a request gets that is not HTTP/1.1 h11 can read (uvicorn's is plain text).
_NOT_HTTP = _raw_response(
    "400 Bad Request",
    "the request is not valid HTTP/1.1 (its request line or headers)",
    "invalid_http",
    kind="invalid_request_error",
)


class _Guard:
    """One server's limits, and its connections that have no request in progress,
    longest waiting first (those the cap may close)."""

    def __init__(self, header_timeout_s: float, body_timeout_s: float, max_connections: int):
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.waiting: dict[GuardedH11Protocol, None] = {}

    def make_room(self) -> bool:
        """Close the connection waiting longest; ``False`` when none is waiting."""
        while self.waiting:
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            if oldest.close_waiting():
                return True
        return False


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body time-outs and a connection cap (see
    the module docstring); ``guard`` is set per server by :func:`guarded_protocol`."""

    guard: ClassVar[_Guard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._reading_body = False
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        if len(self.connections) >= guard.max_connections and not guard.make_room():
            self._refused = True
            transport.write(_BUSY)
            transport.close()
            return
        super().connection_made(transport)
        guard.waiting[self] = None
        self._arm(guard.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._disarm()
        self.guard.waiting.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._timer is None:
            # The first byte of another request on a kept-alive connection.
            self._arm(self.guard.header_timeout_s)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        if state is h11.IDLE:
            return  # still waiting for (the rest of) the headers
        self.guard.waiting.pop(self, None)
        if state is h11.SEND_BODY:
            if not self._reading_body:
                self._reading_body = True
                self._arm(self.guard.body_timeout_s)
        else:
            self._reading_body = False
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            # Idle until the next request (or the keep-alive time-out): room if needed.
            self.guard.waiting.pop(self, None)
            self.guard.waiting[self] = None

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_NOT_HTTP)
        self.transport.close()

    def close_waiting(self) -> bool:
        """Close this connection to make room, unless it is closing already."""
        if self.transport.is_closing():
            return False
        self.transport.close()
        return True

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            self.transport.write(_SLOW)
            self.transport.close()
        elif state is h11.SEND_BODY:
            self.transport.close()


def guarded_protocol(settings: ServeSettings) -> type[GuardedH11Protocol]:
    """The protocol class for one server of ``settings`` (its own waiting list), or a
    :class:`~conductor.errors.UsageError` when the process's file-descriptor limit
    leaves no room for ``max_connections`` (the cap would then not keep it reachable)."""
    _check_fd_room(settings.max_connections)

    class Guarded(GuardedH11Protocol):
        guard = _Guard(settings.header_timeout_s, settings.body_timeout_s, settings.max_connections)

    return Guarded


def _check_fd_room(max_connections: int) -> None:
    try:
        import resource
    except ImportError:  # not on Unix: no such limit to check
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + ACCEPT_BURST + _FD_RESERVE
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        # The soft limit is the process's own to raise (macOS starts at 256): the cap
        # still holds the connections below it, which is what keeps the server reachable.
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise UsageError(
        f"--max-connections {max_connections} needs about {need:,} file descriptors and "
        f"this process may open {hard:,}: lower --max-connections to "
        f"{max(1, hard - ACCEPT_BURST - _FD_RESERVE)}"
    )
