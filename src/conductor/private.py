"""Files conductor writes are private to their owner: the one place that creates them.

Run directories, records, the call and sample cache, downloaded benchmark data,
checkpoints and reports hold prompts, model outputs and grading data.  A graded
program runs as the same machine's user (or another one), so anything readable by
group or other would let it read an earlier run's answers.  Every directory made here
is ``0700`` and every file ``0600``, set explicitly after creation, so the process
umask (``022``, ``000``) cannot loosen them; atomic writes create their temporary file
the same way, so the renamed file is private from its first byte.

Directories written by older versions (``0755`` / ``0644``) are tightened when they are
opened again: :func:`tighten` says what it changed so the caller can log it.

Where conductor keeps its own files between runs is here too (:func:`default_cache_dir`):
the call cache, the local models' crash memory and the templates of checkpoints live
under it, and the packages that own them sit on different floors.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "default_cache_dir",
    "make_private_dir",
    "open_private",
    "own_dir",
    "private_file",
    "temp_beside",
    "temps_left",
    "tighten",
    "write_private",
]

log = logging.getLogger("conductor")

DIR_MODE = 0o700
FILE_MODE = 0o600
#: The permission bits nobody but the owner may hold.
_OTHERS = stat.S_IRWXG | stat.S_IRWXO

_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}

OpenMode = Literal["w", "a", "a+", "x", "wb", "ab", "xb"]


def _chmod_fd(fd: int, mode: int) -> None:
    # fchmod acts on the file opened, never on whatever a path points to meanwhile.
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)


def open_private(
    path: str | Path, mode: OpenMode = "w", *, encoding: str | None = None, buffering: int = -1
) -> IO[Any]:
    """``open(path, mode)``, the file created ``0600`` (an existing file is set to
    ``0600`` too).  ``mode`` is one of ``w a a+ x`` with an optional ``b``."""
    binary = "b" in mode
    base = mode.replace("b", "")
    flags = _FLAGS[base] | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, FILE_MODE)
    try:
        _chmod_fd(fd, FILE_MODE)
        py_mode = base + ("b" if binary else "")
        if binary:
            return os.fdopen(fd, py_mode, buffering=buffering)
        return os.fdopen(fd, py_mode, buffering=buffering, encoding=encoding or "utf-8")
    except BaseException:
        os.close(fd)
        raise


def private_file(path: str | Path) -> None:
    """Create ``path`` empty if absent, ``0600`` either way (a file another library
    then opens, such as SQLite's database, so that it never exists readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        _chmod_fd(fd, FILE_MODE)
    finally:
        os.close(fd)


def write_private(path: str | Path, data: str | bytes, *, atomic: bool = True) -> None:
    """Write ``data`` to ``path``, ``0600``.  ``atomic``: into a temporary file of its
    own beside it (:func:`temp_beside`), then renamed over it, so a reader never sees
    half a file, even with other writers of ``path`` at the same moment (processes of
    one run on a shared directory: each rename is of one writer's whole file, the last
    one's kept); the temporary file is removed when the write fails (the ``OSError``
    is raised)."""
    target = Path(path)
    tmp = temp_beside(target) if atomic else target
    mode: OpenMode = "x" if atomic else "w"
    try:
        if isinstance(data, bytes):
            with open_private(tmp, "xb" if atomic else "wb") as fh:
                fh.write(data)
        else:
            with open_private(tmp, mode, encoding="utf-8") as fh:
                fh.write(data)
        if atomic:
            os.replace(tmp, target)
    except OSError:
        if atomic:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise


def temp_beside(target: Path) -> Path:
    """A new temporary file's name beside ``target``, ``.NAME.PID.RANDOM.tmp``: no other
    writer, in this process or another, picks the same one."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def temps_left(target: Path) -> list[Path]:
    """The temporary files of :func:`temp_beside` for ``target`` that a killed writer
    left beside it."""
    return sorted(target.parent.glob(f".{glob.escape(target.name)}.*.tmp"))


def make_private_dir(path: str | Path) -> Path:
    """Create directory ``path`` and its missing parents, each ``0700``; an existing
    ``path`` is left as it is (see :func:`tighten`).  Returns ``path``."""
    target = Path(path)
    missing: list[Path] = []
    probe = target
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    target.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    # mkdir's mode is filtered by the umask (and parents=True ignores it for parents).
    for made in missing:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(made, DIR_MODE)
    return target


def _loose(path: Path) -> bool:
    try:
        return bool(path.lstat().st_mode & _OTHERS)
    except OSError:
        return False


def _walk(top: Path, names: tuple[str, ...] | None) -> Iterator[Path]:
    """``top``'s entries (only those matching the glob patterns ``names``, when given),
    each followed by everything under it; links are not followed."""
    entries = [top] if names is None else sorted({p for n in names for p in top.glob(n)})
    for entry in entries:
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            for root, dirs, files in os.walk(entry):
                for name in (*dirs, *files):
                    yield Path(root, name)


def _ours(path: Path) -> bool:
    """Whether directory ``path`` is ours to make private: owned by this user and not a
    shared one (the sticky bit: ``/tmp``), so ``--out /tmp`` never closes ``/tmp``."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == getattr(os, "geteuid", lambda: st.st_uid)() and not (
        st.st_mode & stat.S_ISVTX
    )


def tighten(path: str | Path, *, names: tuple[str, ...] | None = None, walk: bool = False) -> int:
    """Take group and other permissions off directory ``path`` and what is in it
    (directories ``0700``, files keep their owner bits, lose the rest); return how many
    entries changed.  ``names``: only the entries matching these glob patterns (and all
    under them), so a run directory given as ``--out .`` leaves the user's other files
    alone; ``path`` itself only when :func:`_ours`.  Cheap when ``path`` is already
    private: its contents are then out of anyone else's reach and are not walked, unless
    ``walk`` (files another library wrote there, such as a saved model).  Links are never
    followed; entries that are not ours to change are left (the count says what was
    done)."""
    top = Path(path)
    if not top.is_dir() or not (walk or _loose(top)):
        return 0
    changed = 0
    if _ours(top) and _loose(top):
        with contextlib.suppress(OSError):
            os.chmod(top, DIR_MODE)
            changed += 1
    for entry in _walk(top, names):
        if entry == top:
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & _OTHERS:
            continue
        mode = DIR_MODE if stat.S_ISDIR(st.st_mode) else stat.S_IMODE(st.st_mode) & ~_OTHERS
        try:
            os.chmod(entry, mode)
        except OSError:
            continue
        changed += 1
    return changed


def own_dir(path: str | Path, what: str, names: tuple[str, ...]) -> Path:
    """:func:`make_private_dir` for ``what`` (``the run directory``, ``the call cache``),
    an existing one left readable by an older version tightened (:func:`tighten`: the
    directory and its entries matching ``names``, those conductor writes there) with a
    warning that says so.  Returns ``path``."""
    target = make_private_dir(path)
    changed = tighten(target, names=names)
    if changed:
        log.warning(
            "%s: %s was readable by other users; made it and its files private to their "
            "owner (%d changed)",
            target,
            what,
            changed,
        )
    return target


def default_cache_dir() -> Path:
    """``$CONDUCTOR_CACHE_DIR``, else the platform's user cache directory."""
    env = os.environ.get("CONDUCTOR_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("conductor", appauthor=False)) / "calls"
