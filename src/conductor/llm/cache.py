"""On-disk cache of model completions.

The key is a SHA-256 over the canonical JSON of everything that decides a reply:
client kind, model, endpoint, messages, sampling parameters, grammar / response
format, tools and tool choice, and the sample index (so that repeated samples differ on
purpose).  API keys are never part of the key or the value.  A value taken from the
environment into the endpoint, the model or a param (``?project=${P}``) is part of the
key as it is, so that two such values never share an entry; the stored values are masked
by value (:data:`conductor.redact.SECRETS`), so the database never holds one in clear.
diskcache stores entries in SQLite, which is safe when several processes share one
directory.

Only complete answers are kept: errors, empty replies and replies cut off at the token
limit (``finish_reason`` ``length`` or a provider's equivalent) are never stored, and
such an entry written by an older version is ignored on reading, so that a rerun asks
the model again instead of replaying a glitch.

The cache holds prompts and answers: its directory is ``0700`` and every file in it
``0600`` (:mod:`conductor.private`; a directory left readable by an older version is
tightened on opening, with a warning).  A cache that cannot be written (disk full,
read-only, not ours) or whose database is damaged raises
:class:`~conductor.errors.CacheError`, whose message says what to do; a damaged
database is deleted and recreated by :func:`discard_cache` (``conductor cache clear``).

Writes are made behind the caller's back (:class:`_WriteBehind`): :meth:`ResponseCache.set`
hands the entry to one writer thread, which commits what has gathered in one SQLite
transaction, so a bench's event loop never waits on the disk (one transaction per
call was a fifth of its thread at high concurrency).  A value handed over is read
back at once (``get`` sees it before it is committed); :meth:`ResponseCache.flush`
waits until everything handed over is on disk, and closing (or the process's normal
exit) flushes.  A fault of the writer (a full disk) is raised as ``CacheError`` by the
next ``set`` or ``flush``: a bench flushes before it writes its summary, so a run
reports only what is cached.  What a ``SIGKILL`` can lose is the entries of the
transaction in flight (milliseconds of answers, asked again on resume).

A store shared by processes may also keep *leases* (:class:`LeasingStore`): a call
that missed claims its key before it is made (:meth:`ResponseCache.claim`), so that
identical calls made at once by several processes are paid once.  The one holding the
lease makes the call and stores the answer; the others wait for the entry, and take
the lease over when it is given back without one (the call failed: errors are never
stored) or runs out (its holder died; a living holder renews it, :class:`CallLease`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from ..errors import CacheError, UsageError
from ..private import FILE_MODE, default_cache_dir, make_private_dir, own_dir, private_file
from ..redact import SECRETS
from .tools import openai_tool_fields
from .types import ModelRequest, RawCompletion, ReportedCost, ToolCall, Usage

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "DB_FILE",
    "CacheStats",
    "CacheStore",
    "CallLease",
    "DiskStore",
    "LEASE_TTL_S",
    "LeasingStore",
    "ResponseCache",
    "cache_fault",
    "cache_key",
    "discard_cache",
    "storable",
]

#: Part of every key: bump to invalidate every cached entry at once.
KEY_VERSION = 1
#: diskcache's database inside the cache directory (its ``-wal`` and ``-shm`` beside it).
DB_FILE = "cache.db"

#: What diskcache writes in the cache directory: its database, and large values as
#: ``XX/YY/NAME.val``.
_CACHE_FILES = (f"{DB_FILE}*", "[0-9a-f][0-9a-f]")

_T = TypeVar("_T")

log = logging.getLogger("conductor")

#: At most this many entries in one transaction of the writer thread.
WRITE_BATCH = 512
#: At most this many entries wait for the writer; a ``set`` beyond it waits for room,
#: so a disk slower than the answers holds the run back rather than its memory growing.
WRITE_QUEUE = 4096

#: SQLite's names for a damaged database (``sqlite3.Error.sqlite_errorname``, extended
#: codes such as ``SQLITE_CORRUPT_INDEX`` included), and its messages where no name is.
_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_CORRUPT_TEXT = ("file is not a database", "malformed", "corrupt")


def _is_corrupt(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if name:
        return name.startswith(_CORRUPT)
    return any(text in str(exc).lower() for text in _CORRUPT_TEXT)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno or 0)
        text = exc.strerror or str(exc)
        return f"{text}, {code}" if code else text
    return str(exc) or type(exc).__name__


def cache_fault(directory: Path, exc: BaseException) -> CacheError:
    """The :class:`CacheError` for ``exc`` met using the cache in ``directory``: what
    happened and what to do (delete the damaged file, or make room / fix permissions)."""
    if _is_corrupt(exc):
        db = directory / DB_FILE
        return CacheError(
            f"the call cache {db} is damaged ({_reason(exc)}): run `conductor cache clear` "
            f"(it deletes and recreates it) or delete {db} yourself",
            path=str(directory),
            corrupt=True,
        )
    return CacheError(
        f"the call cache in {directory} cannot be written ({_reason(exc)}): free space on "
        "its disk or fix its permissions, set CONDUCTOR_CACHE_DIR to a writable directory, "
        "or pass --no-cache",
        path=str(directory),
    )


def discard_cache(directory: str | Path | None = None) -> None:
    """Delete the cache's database and its value files in ``directory`` (nothing else
    there), so the next :class:`ResponseCache` starts empty: the way out of a damaged
    database, which cannot be opened to be cleared."""
    root = Path(directory) if directory is not None else default_cache_dir()
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            (root / f"{DB_FILE}{suffix}").unlink()
    # diskcache keeps large values as ``XX/YY/NAME.val``: those directories only.
    for sub in root.glob("[0-9a-f][0-9a-f]"):
        if sub.is_dir() and all(p.suffix == ".val" for p in sub.glob("*/*")):
            shutil.rmtree(sub)


def _reported(value: Any) -> ReportedCost | None:
    """A stored reported cost (``{"usd": x}``); entries stored before it have none."""
    if not isinstance(value, dict):
        return None
    usd = value.get("usd")
    ok = usd is None or (isinstance(usd, (int, float)) and not isinstance(usd, bool))
    return ReportedCost(None if usd is None else float(usd)) if ok else None


def storable(completion: RawCompletion) -> bool:
    """Whether ``completion`` is a complete answer: not empty (text or a tool call), not
    cut off."""
    return (
        isinstance(completion.text, str)
        and (bool(completion.text.strip()) or bool(completion.tool_calls))
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
    # Only when there are tools, so that every key made before tools existed still holds.
    payload.update(openai_tool_fields(request))
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CacheStats:
    """What a store holds, and where: ``kind`` names the place (``directory`` for the
    files of this host, ``server`` for a shared state server), ``where`` shows it (a
    server's address without its password)."""

    where: str
    entries: int
    size_bytes: int
    oldest: float | None
    newest: float | None
    kind: str = "directory"


def _private_disk() -> type[Any]:
    """diskcache's :class:`~diskcache.Disk`, its value files created private."""
    import diskcache

    class PrivateDisk(diskcache.Disk):  # type: ignore[misc]
        def _write(self, full_path: str, iterator: Any, mode: str, encoding: Any = None) -> Any:
            make_private_dir(os.path.dirname(full_path))
            size = super()._write(full_path, iterator, mode, encoding)
            os.chmod(full_path, FILE_MODE)
            return size

    return PrivateDisk


class _WriteBehind:
    """The writes of one :class:`ResponseCache`, committed by one thread in batches.

    ``pending`` holds what was handed over and not yet taken; ``writing`` what the
    thread is committing now; both are read by :meth:`lookup` so that an entry is seen
    from the moment it is handed over.  The first fault of the disk or the database is
    kept and raised by every later :meth:`put` and :meth:`flush`.
    """

    def __init__(self, cache: Any, directory: Path) -> None:
        self._cache = cache
        self._directory = directory
        self._pending: dict[str, Any] = {}
        self._writing: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # something to write, or closing
        self._done = threading.Condition(self._lock)  # a batch is committed (or failed)
        self._fault: CacheError | None = None
        self._fault_raised = False
        self._closing = False
        # A forked child (a sandbox's) holds a copy of this object but not its thread:
        # it must neither wait for that thread nor write on its behalf.
        self._owner = os.getpid()
        self._thread: threading.Thread | None = None

    def lookup(self, key: str) -> tuple[bool, Any]:
        """``(True, value)`` for an entry handed over and not yet on disk."""
        with self._lock:
            if key in self._pending:
                return True, self._pending[key]
            if key in self._writing:
                return True, self._writing[key]
        return False, None

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._raise_fault()
            while len(self._pending) >= WRITE_QUEUE and self._fault is None:
                self._done.wait()
            self._raise_fault()
            self._pending[key] = value
            if self._thread is None:
                # Started on the first write: a cache only read (a replayed run, the
                # `cache` command) never has a thread.
                self._thread = threading.Thread(
                    target=self._run, name="conductor-cache-writer", daemon=True
                )
                self._thread.start()
            self._work.notify()

    def flush(self) -> None:
        """Wait until every entry handed over is on disk; raise the writer's fault."""
        if os.getpid() != self._owner:
            return
        with self._lock:
            while (self._pending or self._writing) and self._fault is None:
                self._done.wait()
            self._raise_fault()

    def close(self) -> None:
        """Flush, then end the thread.  The writer's fault is raised here only if no
        ``put`` or ``flush`` raised it before: a fault already reported (a bench
        stopped by it) is not reported twice."""
        if os.getpid() != self._owner:
            return
        with self._lock:
            reported = self._fault_raised
        try:
            self.flush()
        except CacheError:
            if not reported:
                raise
        finally:
            with self._lock:
                self._closing = True
                self._work.notify()
                thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join()

    def _raise_fault(self) -> None:
        if self._fault is not None:
            self._fault_raised = True
            raise self._fault

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._work.wait()
                if not self._pending:
                    return  # closing, and nothing is left
                batch = dict(list(self._pending.items())[:WRITE_BATCH])
                for key in batch:
                    del self._pending[key]
                self._writing = batch
            fault = self._commit(batch)
            with self._lock:
                self._writing = {}
                if fault is not None and self._fault is None:
                    self._fault = fault
                    self._pending.clear()  # nothing more is written once the disk failed
                self._done.notify_all()

    def _commit(self, batch: dict[str, Any]) -> CacheError | None:
        """Write ``batch`` in one transaction; the fault of the disk, if any."""
        import diskcache

        faults = (OSError, sqlite3.Error, diskcache.Timeout)
        try:
            with self._cache.transact(retry=True):
                for key, value in batch.items():
                    self._cache.set(key, value)
            return None
        except faults as exc:
            return cache_fault(self._directory, exc)
        except Exception:  # noqa: BLE001 - one value that cannot be stored (pickled)
            pass
        # One entry spoilt the batch: the others are written one by one, the bad ones
        # left out with a warning, as a synchronous write would have refused them.
        for key, value in batch.items():
            try:
                self._cache.set(key, value)
            except faults as exc:
                return cache_fault(self._directory, exc)
            except Exception as exc:  # noqa: BLE001
                log.warning("a cache entry could not be written (%s)", exc)
        return None


def _close_at_exit(ref: weakref.ref[ResponseCache]) -> None:
    cache = ref()
    if cache is not None:
        with contextlib.suppress(Exception):
            cache.close()


class CacheStore(Protocol):
    """Where the entries of a :class:`ResponseCache` live: a key (a SHA-256 digest) to a
    JSON-shaped dict, already masked.  The disk (:class:`DiskStore`, the default) and a
    shared state server (:mod:`conductor.state`) are the two; the cache decides what is
    stored and how an entry reads back, a store only keeps it."""

    #: Where it is, for people (a directory, or a server's address with no secret).
    where: str

    def read(self, key: str) -> Any:
        """The stored value of ``key``, or None."""
        ...

    def write(self, key: str, value: dict[str, Any]) -> None: ...

    def flush(self) -> None:
        """Wait until every value written so far is stored; raise what kept one out."""
        ...

    def stats(self) -> CacheStats: ...

    def clear(self, older_than_s: float | None) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class LeasingStore(Protocol):
    """A :class:`CacheStore` that can also hold a lease on a key (see the module doc).

    ``claim`` returns a token when this caller now holds the lease, ``None`` when
    another does, and ``""`` when the store cannot keep leases now (its server is
    lost): the call is then made with no lease, as the cache fails open.  ``renew`` and
    ``release`` act only for the holder of ``token``."""

    def claim(self, key: str, ttl_s: float) -> str | None: ...

    def renew(self, key: str, token: str, ttl_s: float) -> None: ...

    def release(self, key: str, token: str) -> None: ...


#: How long a lease lasts unless renewed: how long callers wait for a holder that died.
LEASE_TTL_S = 10.0
#: The longest wait between two looks at a key another caller holds.
LEASE_POLL_MAX_S = 0.25


class CallLease:
    """This caller's lease on a key (:meth:`ResponseCache.claim`), renewed every third
    of its life while the call is made; :meth:`release` once the answer is stored."""

    def __init__(self, store: LeasingStore, key: str, token: str) -> None:
        self._store = store
        self.key = key
        self._token = token
        self._renewing = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL_S / 3)
            self._store.renew(self.key, self._token, LEASE_TTL_S)

    def release(self) -> None:
        self._renewing.cancel()
        self._store.release(self.key, self._token)


class DiskStore:
    """The entries in diskcache's SQLite database in a directory, written behind the
    caller's back by :class:`_WriteBehind` (or each in its own transaction)."""

    def __init__(self, directory: str | Path | None = None, *, write_behind: bool = True) -> None:
        import diskcache

        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.where = str(self.directory)
        try:
            own_dir(self.directory, "the call cache", _CACHE_FILES)
            # Made first, so that SQLite opens a private file rather than creating a
            # readable one (its -wal and -shm take the database file's permissions).
            private_file(self.directory / DB_FILE)
            # A generous SQLite timeout: several processes may write at once.
            self._cache = diskcache.Cache(
                str(self.directory), timeout=60, size_limit=2**36, disk=_private_disk()
            )
        except (OSError, sqlite3.Error) as exc:
            if _is_corrupt(exc):
                raise cache_fault(self.directory, exc) from None
            # Read-only, unwritable or not a directory: diskcache writes on opening.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(
                f"the cache directory {self.directory} cannot be used ({reason}); set "
                "CONDUCTOR_CACHE_DIR to a writable directory or pass --no-cache"
            ) from None
        self._writer = _WriteBehind(self._cache, self.directory) if write_behind else None

    def _guard(self, action: Callable[[], _T]) -> _T:
        """``action()``, a fault of the cache's disk or database raised as the
        :class:`CacheError` that says what to do (:func:`cache_fault`)."""
        import diskcache

        try:
            return action()
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            raise cache_fault(self.directory, exc) from None

    def read(self, key: str) -> Any:
        if self._writer is not None:
            found, value = self._writer.lookup(key)
            if found:
                return value
        return self._guard(lambda: self._cache.get(key))

    def write(self, key: str, value: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.put(key, value)
        else:
            self._guard(lambda: self._cache.set(key, value))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def stats(self) -> CacheStats:
        self.flush()
        return self._guard(self._stats)

    def _stats(self) -> CacheStats:
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
        return CacheStats(self.where, entries, int(self._cache.volume()), oldest, newest)

    def clear(self, older_than_s: float | None) -> int:
        self.flush()
        return self._guard(lambda: self._clear(older_than_s))

    def _clear(self, older_than_s: float | None) -> int:
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
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._cache.close()


class ResponseCache:
    """A store of :class:`RawCompletion` values: on disk by default (:class:`DiskStore`;
    with ``write_behind``, the default, its writes are committed by a thread of their
    own, see the module's docstring), or in the ``store`` given (a shared state server).
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        write_behind: bool = True,
        store: CacheStore | None = None,
    ) -> None:
        self._store: CacheStore = (
            store if store is not None else DiskStore(directory, write_behind=write_behind)
        )
        self._closed = False
        # A process that ends without closing the cache still writes what it holds.
        atexit.register(_close_at_exit, weakref.ref(self))

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, key: str) -> RawCompletion | None:
        """The stored complete answer for ``key``, or None (a miss)."""
        value = self._store.read(key)
        if not isinstance(value, dict):
            return None
        try:
            completion = RawCompletion(
                text=value["text"],
                usage=Usage(**value["usage"]),
                raw=value["raw"],
                model=value.get("model"),
                finish_reason=value.get("finish_reason"),
                reported_cost=_reported(value.get("reported_cost")),
                tool_calls=tuple(ToolCall(**c) for c in value.get("tool_calls") or ()),
                batch=value.get("batch") is True,
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
            "reported_cost": None if (c := completion.reported_cost) is None else {"usd": c.usd},
            "stored_at": time.time(),
        }
        if completion.tool_calls:
            value["tool_calls"] = [asdict(c) for c in completion.tool_calls]
        if completion.batch:
            value["batch"] = True
        self._write(key, value)

    async def claim(self, key: str) -> RawCompletion | CallLease | None:
        """Before a call that missed: its answer if another caller stored it meanwhile,
        else the lease to make it (:class:`CallLease`, released once the answer is
        stored), or None where the store keeps no leases.  While another caller holds
        the key, this waits (looking again with a growing pause) for its entry."""
        store = self._store
        if not isinstance(store, LeasingStore):
            return None
        pause = 0.01
        while True:
            token = store.claim(key, LEASE_TTL_S)
            if token == "":
                return None
            # Read after claiming: an answer stored just before the claim is not paid again.
            found = self.get(key)
            if token is not None:
                if found is None:
                    return CallLease(store, key, token)
                store.release(key, token)
            if found is not None:
                return found
            await asyncio.sleep(pause)
            pause = min(pause * 2, LEASE_POLL_MAX_S)

    def get_value(self, key: str) -> Any:
        """A stored value other than a completion (e.g. a finished benchmark sample)."""
        value = self._store.read(key)
        return value.get("value") if isinstance(value, dict) else None

    def set_value(self, key: str, value: Any) -> None:
        self._write(key, {"value": value, "stored_at": time.time()})

    def flush(self) -> None:
        """Wait until every entry set so far is stored; a fault of the store met by
        its writer raises :class:`CacheError` here (and at every later write)."""
        self._store.flush()

    def _write(self, key: str, value: dict[str, Any]) -> None:
        # The one door into the store: what is stored has every secret value of the
        # process masked (a reply echoing a project id, a kept record quoting a URL).
        # Keys are SHA-256 digests of what was asked, secrets included, so that two
        # secrets never share an entry; a digest does not hold the value.
        self._store.write(key, SECRETS.masker().data(value))

    def stats(self) -> CacheStats:
        return self._store.stats()

    def clear(self, older_than_s: float | None = None) -> int:
        """Delete every entry, or those stored more than ``older_than_s`` ago; return how many."""
        return self._store.clear(older_than_s)

    def close(self) -> None:
        """Write what is held (a fault raises :class:`CacheError`), then close."""
        if self._closed:
            return
        self._closed = True
        self._store.close()
