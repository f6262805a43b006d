"""What the serving stores on a state server have in common: an asyncio client of the
named server, and the one sentence each says when the server cannot be reached.

Unlike the call cache, which fails open, these stores hold what must not be guessed (a
key's budget, a stored conversation): a server that does not answer raises
:class:`~conductor.errors.StateUnavailable`, and the caller refuses the request.  The
loss is logged once, and once again when the server is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from ..errors import StateUnavailable
from .url import StateURL

if TYPE_CHECKING:
    import redis.asyncio

__all__ = ["PREFIX", "SharedServer"]

log = logging.getLogger("conductor")

#: Every key these stores write starts with it (the cache's are under ``conductor:cache:``).
PREFIX = "conductor:"
#: How long one request to the server may take before it counts as lost.
SOCKET_TIMEOUT_S = 2.0

#: Connections to the server one process opens at most (the rest wait their turn).
MAX_CONNECTIONS = 32

_T = TypeVar("_T")


class SharedServer:
    """One asyncio connection pool to the server at ``url``, made in the event loop that
    uses it (a pool belongs to its loop), and the lost/back lines of ``what``."""

    def __init__(self, url: StateURL, what: str) -> None:
        self.url = url
        self.what = what
        self._client: redis.asyncio.Redis | None = None
        self._pool: redis.asyncio.BlockingConnectionPool | None = None
        self._lock = threading.Lock()
        self._lost = False

    @property
    def client(self) -> redis.asyncio.Redis:
        if self._client is None:
            import redis.asyncio as aredis

            # A bounded pool that requests wait on: a flood of requests shares a few
            # connections instead of opening one each on the server.
            pool = aredis.BlockingConnectionPool.from_url(
                self.url.url,
                max_connections=MAX_CONNECTIONS,
                timeout=SOCKET_TIMEOUT_S,
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=SOCKET_TIMEOUT_S,
            )
            self._pool = pool
            self._client = aredis.Redis(connection_pool=pool)
        return self._client

    async def ask(self, work: Awaitable[_T]) -> _T:
        """``work``'s result, or :class:`StateUnavailable` (one log line when first lost)."""
        import redis as redis_lib

        try:
            result = await work
        except (redis_lib.ConnectionError, redis_lib.TimeoutError, OSError) as exc:
            with self._lock:
                first, self._lost = not self._lost, True
            if first:
                log.warning(
                    "the state server at %s cannot be reached (%s): %s",
                    self.url.public,
                    type(exc).__name__,
                    self.what,
                )
            raise StateUnavailable(
                f"the state server at {self.url.public} cannot be reached",
                where=self.url.public,
            ) from None
        if self._lost:
            with self._lock:
                back, self._lost = self._lost, False
            if back:
                log.warning("the state server at %s is back", self.url.public)
        return result

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
        if self._pool is not None:  # a pool handed to a client is not closed with it
            pool, self._pool = self._pool, None
            await pool.disconnect()
