"""Sandboxes started ahead of time: a few ready sandboxes per setting, each handed out
once and replaced in the background, so that starting one (bubblewrap, the interpreter,
the driver and its imports: most of a short sample's grading time) overlaps other work.

Each sandbox in a pool is taken at most once (:meth:`WarmPool.take` removes it) and
runs one job; nothing here ever puts a used one back.  A pool belongs to the process
that made it: after a fork the child starts its own (the parent's sandboxes are not its
children to wait for).
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["WarmPool", "warm_pool"]

T = TypeVar("T")

_POOLS: dict[tuple[int, Hashable], WarmPool[Any]] = {}
_POOLS_LOCK = threading.Lock()
# a start that failed (bwrap missing, out of fds) is not retried at once: the caller's
# own start reports why, and a loop of failing starts would only burn the CPU
_BACKOFF_S = 1.0


class WarmPool(Generic[T]):
    """Up to ``size`` items made by ``start`` and kept ready by one background thread;
    ``alive`` says whether an item is still usable, ``discard`` ends one."""

    def __init__(
        self,
        start: Callable[[], T],
        alive: Callable[[T], bool],
        discard: Callable[[T], None],
        size: int,
    ) -> None:
        self._start, self._alive, self._discard = start, alive, discard
        self.size = max(0, int(size))
        self._ready: collections.deque[T] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._pid = os.getpid()
        #: How many items were handed out, and how many were made (for tests and figures).
        self.taken = 0
        self.started = 0
        self._thread = threading.Thread(target=self._fill, name="sandbox-warm", daemon=True)
        self._thread.start()

    def take(self) -> T | None:
        """A ready item, removed from the pool (it is never handed out again), or None
        where none is ready now (the caller starts its own)."""
        if os.getpid() != self._pid:
            return None
        while True:
            with self._cond:
                if not self._ready:
                    self._cond.notify_all()
                    return None
                item = self._ready.popleft()
                self._cond.notify_all()
            if self._alive(item):
                self.taken += 1
                return item
            self._discard(item)

    def resize(self, size: int) -> None:
        """Keep at least ``size`` ready from now on."""
        with self._cond:
            if size > self.size:
                self.size = int(size)
                self._cond.notify_all()

    def close(self) -> None:
        """Stop refilling and end every ready item."""
        with self._cond:
            self._closed = True
            items = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        if os.getpid() == self._pid:
            for item in items:
                self._discard(item)

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                item = self._start()
            except Exception:  # reported by the caller's own start, which fails the same way
                time.sleep(_BACKOFF_S)
                continue
            self.started += 1
            if not self._alive(item):
                self._discard(item)
                time.sleep(_BACKOFF_S)
                continue
            with self._cond:
                if self._closed:
                    closed = True
                else:
                    closed = False
                    self._ready.append(item)
            if closed:
                self._discard(item)
                return


def warm_pool(
    key: Hashable,
    start: Callable[[], T],
    alive: Callable[[T], bool],
    discard: Callable[[T], None],
    size: int,
) -> WarmPool[T]:
    """This process's pool for ``key`` (made on first use with these functions), holding
    at least ``size`` ready items."""
    with _POOLS_LOCK:
        pool = _POOLS.get((os.getpid(), key))
        if pool is None:
            pool = WarmPool(start, alive, discard, size)
            _POOLS[(os.getpid(), key)] = pool
        else:
            pool.resize(size)
    return pool


@atexit.register
def _close_all() -> None:
    with _POOLS_LOCK:
        pools = [p for (pid, _), p in _POOLS.items() if pid == os.getpid()]
        _POOLS.clear()
    for pool in pools:
        pool.close()
