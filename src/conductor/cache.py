"""Moved to :mod:`conductor.llm.cache` (the call cache lives beside the callers).

A re-export kept while other modules still import it from here; to be deleted once
they import :mod:`conductor.llm.cache` (issue 11).
"""

from __future__ import annotations

from .llm.cache import (
    KEY_VERSION,
    CacheStats,
    ResponseCache,
    cache_key,
    default_cache_dir,
    storable,
)

__all__ = [
    "KEY_VERSION",
    "CacheStats",
    "ResponseCache",
    "cache_key",
    "default_cache_dir",
    "storable",
]
