"""On-disk cache of model completions.

The key is a SHA-256 over the canonical JSON of everything that decides a reply:
client kind, model, endpoint, messages, sampling parameters, grammar / response
format, and the sample index (so that repeated samples differ on purpose).  API keys
are never part of the key or the value.  diskcache stores entries in SQLite, which is
safe when several processes share one directory.

Only complete answers are kept: errors, empty replies and replies cut off at the token
limit (``finish_reason`` ``length`` or a provider's equivalent) are never stored, and
such an entry written by an older version is ignored on reading, so that a rerun asks
the model again instead of replaying a glitch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .types import ModelRequest, RawCompletion, Usage

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["CacheStats", "ResponseCache", "cache_key", "default_cache_dir", "storable"]

#: Part of every key: bump to invalidate every cached entry at once.
KEY_VERSION = 1


def default_cache_dir() -> Path:
    """``$CONDUCTOR_CACHE_DIR``, else the platform's user cache directory."""
    env = os.environ.get("CONDUCTOR_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("conductor", appauthor=False)) / "calls"


def storable(completion: RawCompletion) -> bool:
    """Whether ``completion`` is a complete answer: not empty, not cut off."""
    return (
        isinstance(completion.text, str)
        and bool(completion.text.strip())
        and not completion.truncated
    )


def cache_key(target: Worker, request: ModelRequest) -> str:
    """The cache key of ``request`` sent to ``target``."""
    payload = {
        "v": KEY_VERSION,
        "client": target.client,
        "model": target.model,
        "api_base": target.api_base or "",
        "model_path": target.model_path or "",
        "system_prompt": target.system_prompt or "",
        "messages": list(request.messages),
        "params": request.params,
        "grammar": request.grammar,
        "response_format": request.response_format,
        "sample": request.sample_index,
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CacheStats:
    directory: str
    entries: int
    size_bytes: int
    oldest: float | None
    newest: float | None


class ResponseCache:
    """A diskcache-backed store of :class:`RawCompletion` values."""

    def __init__(self, directory: str | Path | None = None) -> None:
        import diskcache

        self.directory = Path(directory) if directory is not None else default_cache_dir()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # A generous SQLite timeout: several processes may write at once.
            self._cache = diskcache.Cache(str(self.directory), timeout=60, size_limit=2**36)
        except (OSError, sqlite3.Error) as exc:
            # Read-only, unwritable or not a directory: diskcache writes on opening.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(
                f"the cache directory {self.directory} cannot be used ({reason}); set "
                "CONDUCTOR_CACHE_DIR to a writable directory or pass --no-cache"
            ) from None

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, key: str) -> RawCompletion | None:
        """The stored complete answer for ``key``, or None (a miss)."""
        value = self._cache.get(key)
        if not isinstance(value, dict):
            return None
        try:
            completion = RawCompletion(
                text=value["text"],
                usage=Usage(**value["usage"]),
                raw=value["raw"],
                model=value.get("model"),
                finish_reason=value.get("finish_reason"),
            )
        except (KeyError, TypeError):
            return None
        return completion if storable(completion) else None

    def set(self, key: str, completion: RawCompletion) -> None:
        """Store ``completion`` under ``key``, unless it is not a complete answer."""
        if not storable(completion):
            return
        value: dict[str, Any] = {
            "text": completion.text,
            "usage": asdict(completion.usage),
            "raw": completion.raw,
            "model": completion.model,
            "finish_reason": completion.finish_reason,
            "stored_at": time.time(),
        }
        self._cache.set(key, value)

    def get_value(self, key: str) -> Any:
        """A stored value other than a completion (e.g. a finished benchmark sample)."""
        value = self._cache.get(key)
        return value.get("value") if isinstance(value, dict) else None

    def set_value(self, key: str, value: Any) -> None:
        self._cache.set(key, {"value": value, "stored_at": time.time()})

    def stats(self) -> CacheStats:
        entries = 0
        oldest: float | None = None
        newest: float | None = None
        for key in self._cache.iterkeys():
            value = self._cache.get(key)
            entries += 1
            if isinstance(value, dict) and "stored_at" in value:
                t = float(value["stored_at"])
                oldest = t if oldest is None else min(oldest, t)
                newest = t if newest is None else max(newest, t)
        return CacheStats(str(self.directory), entries, int(self._cache.volume()), oldest, newest)

    def clear(self, older_than_s: float | None = None) -> int:
        """Delete every entry, or those stored more than ``older_than_s`` ago; return how many."""
        if older_than_s is None:
            return int(self._cache.clear())
        cutoff = time.time() - older_than_s
        removed = 0
        for key in list(self._cache.iterkeys()):
            value = self._cache.get(key)
            stored = value.get("stored_at", 0.0) if isinstance(value, dict) else 0.0
            if stored < cutoff and self._cache.delete(key):
                removed += 1
        return removed

    def close(self) -> None:
        self._cache.close()
