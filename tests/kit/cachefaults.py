"""A call cache whose disk fills up: diskcache's writes fail as SQLite fails on a full
disk, from a chosen write on."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest


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
