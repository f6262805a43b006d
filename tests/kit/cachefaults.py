"""A call cache whose disk fills up: diskcache's writes fail as SQLite fails on a full
disk, from a chosen write on."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import pytest

from conductor.errors import CacheError
from conductor.llm.cache import ResponseCache


def full_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """The first ``writes`` writes succeed, every later one fails."""
    import diskcache

    real = diskcache.Cache.set
    left = [writes]

    def set_(self: Any, *args: Any, **kw: Any) -> Any:
        if left[0] <= 0:
            raise sqlite3.OperationalError("database or disk is full")
        left[0] -= 1
        return real(self, *args, **kw)

    monkeypatch.setattr(diskcache.Cache, "set", set_)


def caches_made(monkeypatch: pytest.MonkeyPatch) -> list[ResponseCache]:
    """Every :class:`ResponseCache` made from now on in this test, in order."""
    made: list[ResponseCache] = []
    real = ResponseCache.__init__

    def init(self: ResponseCache, *args: Any, **kw: Any) -> None:
        real(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(ResponseCache, "__init__", init)
    return made


def settle(caches: list[ResponseCache]) -> None:
    """Wait until every write handed to ``caches`` is committed or has failed.

    The writes are made by each cache's writer thread, which a busy machine may leave
    waiting while the code under test goes on: a test that needs a fault known by a
    given point settles the caches there (their fault, raised here by ``flush``, is the
    code under test's to meet at its next write)."""
    for cache in caches:
        with contextlib.suppress(CacheError):
            cache.flush()
