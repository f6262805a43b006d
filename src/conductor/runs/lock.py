"""Holding a bench run directory: the ``.lock`` that keeps a second process out
(:class:`RunDirBusyError`), and undoing a run that failed before its first record.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import IO

from ..errors import UsageError
from ..private import open_private
from .rundir import CONFIG, LOCK, SAMPLES

__all__ = [
    "RunDirBusyError",
    "absent_dirs",
    "absent_files",
    "holds_records",
    "join_run_dir",
    "lock_run_dir",
    "share_lock",
    "undo_empty_run",
]

if sys.platform != "win32":
    import fcntl


class RunDirBusyError(UsageError):
    """Another process holds the run directory."""


# A run that fails before its first record (a bad data file, a dataset out of reach, a
# Conductor that cannot load) must not leave a directory that refuses the same command
# once the input is fixed.  Two rules cover it: the failed invocation removes what it
# created (its files, then its directories if they are empty: rmdir never removes a
# directory holding anything else), and a directory without records is taken over by
# the next run (what a killed process, or a folder the user made, leaves behind).
# A directory with a record in samples.jsonl is never removed nor taken over.


def absent_dirs(out: Path) -> list[Path]:
    """``out`` and those of its parents that do not exist yet, deepest first."""
    missing: list[Path] = []
    path = out.absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def absent_files(out: Path) -> list[Path]:
    """The run files this invocation would create in ``out`` (those not there yet)."""
    return [out / name for name in (CONFIG, SAMPLES, LOCK) if not (out / name).exists()]


def holds_records(out: Path) -> bool:
    """Whether ``out`` has anything in ``samples.jsonl`` (even a torn first line)."""
    path = out / SAMPLES
    return path.is_file() and path.stat().st_size > 0


def undo_empty_run(out: Path, created_dirs: list[Path], new_files: list[Path]) -> None:
    """Remove the files and directories this invocation created, if no record was
    written; anything else in the directory keeps it (and the directory) in place."""
    if holds_records(out):
        return
    for path in new_files:
        with suppress(OSError):
            path.unlink()
    for folder in created_dirs:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (or not ours to remove): neither are its parents


def lock_run_dir(out: Path) -> IO[str]:
    """Hold ``out/.lock`` for this process; the OS releases it when the process ends,
    however it ends, so a killed run never leaves a stale lock."""
    path = out / LOCK
    try:
        fh = open_private(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot create the lock file ({exc.strerror})") from None
    if sys.platform == "win32":  # no flock; the directory is not guarded there
        return fh
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise RunDirBusyError(
                f"{out} is in use by another conductor process (pid {holder}); wait for it "
                "to finish or stop it, or choose another --out"
            ) from None
        raise UsageError(f"{path}: cannot lock the run directory ({exc.strerror})") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


#: How long a process joining a run waits for the first one to finish claiming it.
JOIN_WAIT_S = 30.0


def join_run_dir(out: Path) -> tuple[IO[str], bool]:
    """Hold ``out/.lock`` for a run shared through the state server: exclusively when
    no other process holds it (returns ``True``: this process claims the run, then
    calls :func:`share_lock`), else shared beside the processes already running it
    (``False``).  A process holding it exclusively for longer than
    :data:`JOIN_WAIT_S` (one without ``--state``) keeps this one out."""
    try:
        return lock_run_dir(out), True
    except RunDirBusyError:
        pass
    if sys.platform == "win32":  # pragma: no cover - no flock: the directory is not guarded
        return open_private(out / LOCK, "a+", encoding="utf-8"), False
    path = out / LOCK
    fh = open_private(path, "a+", encoding="utf-8")
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fh, False
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                fh.close()
                raise UsageError(
                    f"{path}: cannot lock the run directory ({exc.strerror})"
                ) from None
        if time.monotonic() > deadline:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise RunDirBusyError(
                f"{out} is in use by a conductor process that does not share it (pid "
                f"{holder}, started without --state); wait for it to finish or stop it, "
                "or choose another --out"
            )
        time.sleep(0.2)


def share_lock(fh: IO[str]) -> None:
    """Turn this process's exclusive hold of the lock into a shared one: the run is
    claimed, others may join it."""
    if sys.platform != "win32":
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
