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
  closed;
- :mod:`~conductor.state.claims` and :mod:`~conductor.state.spend`: a bench run's
  leases on its samples and its one spend counter, shared by its processes;
- :mod:`~conductor.state.conversations` and :mod:`~conductor.state.budgets`: what
  ``conductor serve`` replicas share (stored responses, keys' budgets by reservation),
  failing closed where the cache fails open (:mod:`~conductor.state.shared`).

A floor above the model calls: it stores what :mod:`conductor.llm.cache` decides to
keep, and knows nothing of records or requests (a run's samples are strings to it, a
serve key an opaque identity).  ``redis`` (the ``state`` extra) is imported only when
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
