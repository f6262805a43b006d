"""The call cache's entries on a Redis-protocol server, shared by every process.

The cache itself (:class:`~conductor.llm.cache.ResponseCache`) decides what is kept
(complete answers only, every secret masked) and the keys (SHA-256 digests of what was
asked); this store only keeps entries, so two processes on two hosts that ask the same
thing find one entry.

Layout, under one prefix per database: ``conductor:cache:e:<digest>`` holds an entry,
``conductor:cache:when`` is a sorted set of digests by the time each was stored and
``conductor:cache:bytes`` the bytes stored, so ``stats`` is three constant-time reads
and ``clear --older-than`` reads only what it deletes.  An entry is JSON, compressed
with zlib when it is over :data:`COMPRESS_OVER` bytes (a provider's raw reply is most of
it and compresses several times); the first byte says which.  Nothing read from the
server is unpickled or evaluated: a value that is not one of the two forms is a miss.

Identical calls made at once by several processes are paid once: a call that missed
claims ``conductor:cache:lease:<digest>`` (``SET NX PX`` with a random token; the
holder renews it and deletes it, both by a script that acts only for the token it
holds, so a holder whose lease ran out and passed to another never frees the other's);
see :class:`~conductor.llm.cache.LeasingStore` for the rest, which is the cache's.

The cache fails open: a server that cannot be reached (down, restarted, timing out)
makes every read a miss and every write a no-op, with one warning when it is first
lost and one line when it is back; the run goes on paying for its calls.  Budgets and
limits, which must fail closed, are not kept here.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import zlib
from typing import TYPE_CHECKING, Any

from ..errors import CacheError, UsageError
from ..llm.cache import CacheStats, ResponseCache
from .url import STATE_ENV, StateURL

if TYPE_CHECKING:
    import redis

__all__ = [
    "COMPRESS_OVER",
    "MAX_ENTRY_BYTES",
    "PREFIX",
    "RedisCacheStore",
    "open_call_cache",
    "open_shared_cache",
]

log = logging.getLogger("conductor")

#: Every key this store writes starts with it.
PREFIX = "conductor:cache:"
_ENTRY = PREFIX + "e:"
_WHEN = PREFIX + "when"
_BYTES = PREFIX + "bytes"
_LEASE = PREFIX + "lease:"
# Only the holder of the token frees or extends a lease.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
#: Entries longer than this (JSON bytes) are stored compressed.
COMPRESS_OVER = 1024
_PLAIN, _ZLIB = b"j", b"z"
#: The most an entry may grow to when decompressed: far above any reply (a reply is
#: bounded by its max_tokens), far below what a hand-made zlib bomb written to a shared
#: server would take of this process's memory.
MAX_ENTRY_BYTES = 64 << 20
#: How long one request to the server may take before the cache counts it as lost.
SOCKET_TIMEOUT_S = 2.0
#: Digests deleted per request by ``clear``.
_CHUNK = 512


def encode(value: dict[str, Any]) -> bytes:
    """An entry as stored: a form byte, then JSON (compressed when long)."""
    blob = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if len(blob) > COMPRESS_OVER:
        return _ZLIB + zlib.compress(blob, 1)
    return _PLAIN + blob


def decode(data: bytes | None) -> Any:
    """A stored entry, or None for anything that is not one of the two forms."""
    if not data:
        return None
    form, body = data[:1], data[1:]
    try:
        if form == _ZLIB:
            inflate = zlib.decompressobj()
            body = inflate.decompress(body, MAX_ENTRY_BYTES)
            if inflate.unconsumed_tail:
                return None  # it would grow past the bound
        elif form != _PLAIN:
            return None
        value = json.loads(body)
    except (zlib.error, ValueError, RecursionError):  # RecursionError: nesting too deep
        return None
    return value if isinstance(value, dict) else None


class RedisCacheStore:
    """A :class:`~conductor.llm.cache.CacheStore` on the server at ``url``."""

    def __init__(self, url: StateURL, *, client: redis.Redis | None = None) -> None:
        import redis as redis_lib

        self.url = url
        self.where = url.public
        self._errors: tuple[type[BaseException], ...] = (
            redis_lib.ConnectionError,
            redis_lib.TimeoutError,
            OSError,
        )
        self._redis = client or redis_lib.Redis.from_url(
            url.url,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            health_check_interval=30,
        )
        self._lock = threading.Lock()
        self._lost = False
        self._release = self._redis.register_script(_RELEASE)
        self._renew = self._redis.register_script(_RENEW)

    def check(self) -> None:
        """Ask the server once: credentials it refuses raise
        :class:`~conductor.errors.UsageError`; a server not reachable is reported as
        lost (one line) and the cache goes on failing open."""
        import redis as redis_lib

        try:
            self._redis.ping()
        except redis_lib.AuthenticationError as exc:
            raise UsageError(
                f"the state server at {self.where} refused this URL's credentials "
                f"({type(exc).__name__}): check the user and password in --state or "
                f"${STATE_ENV}"
            ) from None
        except self._errors as exc:
            self._down(exc)

    # --- failing open ----------------------------------------------------------------

    def _down(self, exc: BaseException) -> None:
        with self._lock:
            first, self._lost = not self._lost, True
        if first:
            log.warning(
                "the shared call cache at %s cannot be reached (%s): calls are asked "
                "again and nothing is stored until it answers",
                self.where,
                type(exc).__name__,
            )

    def _up(self) -> None:
        if self._lost:
            with self._lock:
                back, self._lost = self._lost, False
            if back:
                log.warning("the shared call cache at %s is back", self.where)

    # --- the store -------------------------------------------------------------------

    def read(self, key: str) -> Any:
        try:
            data = self._redis.get(_ENTRY + key)
        except self._errors as exc:
            self._down(exc)
            return None
        self._up()
        return decode(data if isinstance(data, bytes) else None)

    def write(self, key: str, value: dict[str, Any]) -> None:
        blob = encode(value)
        stored_at = float(value.get("stored_at") or time.time())
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.set(_ENTRY + key, blob, get=True)
            pipe.zadd(_WHEN, {key: stored_at})
            old, _ = pipe.execute()[:2]
            grown = len(blob) - (len(old) if isinstance(old, bytes) else 0)
            if grown:
                self._redis.incrby(_BYTES, grown)
        except self._errors as exc:
            self._down(exc)
            return
        self._up()

    # --- leases (a LeasingStore) -----------------------------------------------------

    def claim(self, key: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        try:
            held = self._redis.set(_LEASE + key, token, nx=True, px=max(1, int(ttl_s * 1000)))
        except self._errors as exc:
            self._down(exc)
            return ""  # failing open: the call is made with no lease
        self._up()
        return token if held else None

    def renew(self, key: str, token: str, ttl_s: float) -> None:
        try:
            self._renew(keys=[_LEASE + key], args=[token, max(1, int(ttl_s * 1000))])
        except self._errors as exc:
            self._down(exc)

    def release(self, key: str, token: str) -> None:
        try:
            self._release(keys=[_LEASE + key], args=[token])
        except self._errors as exc:
            self._down(exc)

    def flush(self) -> None:
        """Nothing is held back: each write is on the server when it returns."""

    def stats(self) -> CacheStats:
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.zcard(_WHEN)
            pipe.zrange(_WHEN, 0, 0, withscores=True)
            pipe.zrange(_WHEN, -1, -1, withscores=True)
            pipe.get(_BYTES)
            entries, first, last, size = pipe.execute()
        except self._errors as exc:
            self._down(exc)
            return CacheStats(self.where, 0, 0, None, None, kind="server")
        return CacheStats(
            self.where,
            int(entries),
            max(0, int(size or 0)),
            float(first[0][1]) if first else None,
            float(last[0][1]) if last else None,
            kind="server",
        )

    def clear(self, older_than_s: float | None) -> int:
        """Delete entries by their time in the index; a server that cannot be reached
        is :class:`~conductor.errors.CacheError` (clearing nothing is not a success)."""
        try:
            return self._clear(older_than_s)
        except self._errors as exc:
            raise CacheError(
                f"the shared call cache at {self.where} cannot be reached "
                f"({type(exc).__name__}): nothing more was cleared",
                path=self.where,
            ) from None

    def _clear(self, older_than_s: float | None) -> int:
        top = "+inf" if older_than_s is None else f"({time.time() - older_than_s!r}"
        removed = 0
        while True:
            digests: list[bytes] = list(
                self._redis.zrangebyscore(_WHEN, "-inf", top, start=0, num=_CHUNK)  # type: ignore[arg-type]
            )
            if not digests:
                break
            names = [_ENTRY + (d.decode() if isinstance(d, bytes) else str(d)) for d in digests]
            pipe = self._redis.pipeline(transaction=True)
            for name in names:
                pipe.strlen(name)
            pipe.delete(*names)
            pipe.zrem(_WHEN, *digests)
            *sizes, deleted, _ = pipe.execute()
            self._redis.incrby(_BYTES, -sum(int(s) for s in sizes))
            removed += int(deleted)
        if older_than_s is None:
            self._redis.delete(_BYTES)
        return removed

    def close(self) -> None:
        self._redis.close()


def open_call_cache(url: StateURL | None) -> ResponseCache:
    """A command's call cache: on the state server ``url`` names, else on this machine's
    disk (:class:`~conductor.llm.cache.ResponseCache`'s default directory)."""
    return ResponseCache() if url is None else open_shared_cache(url)


def open_shared_cache(url: StateURL) -> ResponseCache:
    """The call cache of a command given ``--state URL``.  A server that refuses the
    URL's credentials is a mistake in the command (:class:`~conductor.errors.UsageError`,
    one sentence); one that cannot be reached now is a fault, and the cache fails open
    (:meth:`RedisCacheStore.check`)."""
    store = RedisCacheStore(url)
    store.check()
    return ResponseCache(store=store)
