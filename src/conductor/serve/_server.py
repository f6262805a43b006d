"""Running the app under uvicorn: in the foreground for the CLI, or in a thread.

The socket is bound here, before uvicorn starts, so that a port in use is one
sentence (a :class:`~conductor.errors.UsageError`) and ``port=0`` knows its port.
Stopping (SIGTERM or SIGINT in the foreground, leaving the ``serve_in_thread`` block)
stops accepting connections, lets the requests in flight finish for up to
``grace_s``, then closes the clients, the cache and the records file.  Connections
are read by :class:`~._guard.GuardedH11Protocol` (time-outs on reading a request, a
cap on connections open).  Nothing here prints: the CLI is told the URL through
``on_listening``.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn
from fastapi import FastAPI

from ..conductors.spec import Conductor
from ..errors import ConductorError, UsageError
from ._app import create_app
from ._guard import ACCEPT_BURST, guarded_protocol
from ._service import Service
from ._settings import ServeSettings

__all__ = ["run_server", "serve_in_thread"]

#: How long ``serve_in_thread`` waits for the server to start.
_START_TIMEOUT_S = 60.0


class _Server(uvicorn.Server):
    """uvicorn's server, telling ``on_listening`` once it accepts connections."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._on_listening()


def _bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (0 picks a free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: not an address to listen on ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port "
            "(0 picks a free one)"
        ) from None
    sock.set_inheritable(True)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def _config(settings: ServeSettings, app: FastAPI | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        app if app is not None else create_app(settings),
        log_config=None,  # leave the process's logging alone; warnings still show
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws="none",
        # Annotated int, but awaited with asyncio.wait_for, which takes any number.
        timeout_graceful_shutdown=settings.grace_s,  # type: ignore[arg-type]
        server_header=False,
        http=guarded_protocol(settings),  # time-outs on reading requests, a connection cap
        backlog=ACCEPT_BURST,
        # Annotated int, but used as a delay of call_later, which takes any number.
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
    )


def run_server(
    settings: ServeSettings,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_listening: Callable[[str], None] | None = None,
    conductor: Conductor | None = None,
) -> int:
    """Serve in the foreground until SIGTERM or SIGINT, then stop gracefully and
    return how many requests it served (see :class:`~conductor.serve._service.Slots`).
    ``on_listening`` gets the base URL (``http://HOST:PORT/v1``) once the server
    accepts connections; ``conductor``, the Conductor of ``settings`` where the caller
    has resolved it already."""
    app = create_app(settings, conductor)
    config = _config(settings, app)
    sock = _bind(host, port)
    url = _url(host, sock)
    server = _Server(config, lambda: on_listening(url) if on_listening else None)
    # uvicorn sends a signal it stopped for to the handler it found once it is done;
    # these make that a plain return, so a stop on request is exit 0.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    # The service outlives the app's lifespan on its state: what it counted is kept.
    service: Service | None = getattr(app.state, "service", None)
    return service.slots.served if service is not None else 0


def _stopped(signum: int, frame: FrameType | None) -> None:
    """The server has already stopped for this signal: nothing more to do."""


@contextmanager
def serve_in_thread(
    settings: ServeSettings, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Run a server in a background thread; yield its base URL
    (``http://HOST:PORT/v1``) once it accepts connections, and stop it gracefully when
    the block ends."""
    config = _config(settings)
    sock = _bind(host, port)
    ready = threading.Event()
    server = _Server(config, ready.set)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="conductor-serve", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not ready.wait(0.01):
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=5)
            sock.close()
            raise ConductorError(f"the server on {host}:{port} did not start")
    try:
        yield _url(host, sock)
    finally:
        server.should_exit = True
        thread.join(timeout=settings.grace_s + 10)
        sock.close()
