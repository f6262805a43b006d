"""State shared by every process of a run, on a Redis-protocol server.

``--state redis://HOST:PORT/DB`` (or ``CONDUCTOR_STATE_URL``) names the server; with
none, each process keeps its state in local files as before.  What lives here:

- :mod:`~conductor.state.url`: the address, read once and never shown with its secrets
  (:class:`StateURL`);
- :mod:`~conductor.state.redis_cache`: the call cache's entries on the server
  (:class:`RedisCacheStore`, a :class:`~conductor.llm.cache.CacheStore`), so that
  processes on any host pay an identical call once;
- :mod:`~conductor.state.redis_limiter`: each provider key's request rate (a worker's
  ``rpm:``) on the server (:class:`RedisRates`), one rate for every process, failing
  closed.

A floor above the model calls: it stores what :mod:`conductor.llm.cache` decides to
keep, and knows nothing of runs.  ``redis`` (the ``state`` extra) is imported only when
a server is named.
"""

from __future__ import annotations

from .redis_cache import RedisCacheStore, open_call_cache, open_shared_cache
from .redis_limiter import RedisRates, open_rates
from .url import STATE_ENV, StateURL, state_url_from

__all__ = [
    "STATE_ENV",
    "RedisCacheStore",
    "RedisRates",
    "StateURL",
    "open_call_cache",
    "open_rates",
    "open_shared_cache",
    "state_url_from",
]
