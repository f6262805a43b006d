"""Files the user names: opened only when they are regular files, and read with a bound.

Every reader of a path the user gives (pool, benchmark, template, training and keys
files, data files, run records and run directories, router directories) opens it
through :func:`open_regular`, so they all refuse the same things in the same words:

- a path that is not a regular file (a device such as ``/dev/zero``, which never ends;
  a FIFO, which blocks until someone writes to it; a directory; a socket) is refused
  before anything is read, and before it is opened where opening could block or act
  (a FIFO's open waits for a writer; opening some devices does something).  The check
  is made again on the descriptor opened (``fstat``), so a path swapped between the two
  is still refused; a symbolic link is followed, and one that loops is named as such;
- a whole-file read (:func:`read_regular`, :func:`read_text`) stops one byte past its
  bound and refuses the file, so a huge (or sparse) file is never held in memory;
- a line-by-line read (:func:`bounded_lines`) holds at most one line's bound of bytes:
  a longer line is reported without being read whole, and the rest of it is skipped
  in small blocks, so a 2 GB line costs the bound, not 2 GB.

The file stays open with ``O_NONBLOCK``: a regular file ignores it, and a file that
claims to be regular but waits for data (some ``/proc`` files) then ends instead of
hanging.  Each refusal is an :class:`UnreadableFileError` (a
:class:`~conductor.errors.UsageError`: exit 2): one sentence naming the path, which a
reader with its own error class re-raises as that (:attr:`UnreadableFileError.reason`).
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

from .errors import UsageError
from .text import printable

__all__ = [
    "LINE_READ_BLOCK",
    "Unreadable",
    "MAX_CONFIG_BYTES",
    "UnreadableFileError",
    "bounded_lines",
    "check_appendable",
    "check_regular",
    "describe_size",
    "file_kind",
    "is_regular",
    "open_regular",
    "parse_json",
    "read_regular",
    "read_text",
    "resolved",
    "utf8_text",
]

#: The most a configuration file (pool, benchmark, template, training config, keys
#: file) may hold: the largest shipped one is a few kilobytes.
MAX_CONFIG_BYTES = 16 << 20
#: The block a line longer than its bound is skipped in (what is held meanwhile).
LINE_READ_BLOCK = 1 << 16


#: Why a file cannot be read: nothing there, not a regular file, more than its bound,
#: not UTF-8 text, not JSON (where JSON is wanted), or the system refused (permissions,
#: I/O).
Unreadable = Literal["missing", "not_regular", "too_big", "not_utf8", "not_json", "refused"]


class UnreadableFileError(UsageError):
    """A file the user named cannot be read as one (``kind`` says why).  ``reason`` is
    the message without the path, for readers that raise it as their own kind of
    error; ``line`` the line it is about, where there is one."""

    def __init__(
        self, path: str | Path, reason: str, kind: Unreadable, line: int | None = None
    ) -> None:
        self.path = str(path)
        self.reason = reason
        self.kind: Unreadable = kind
        self.line = line
        where = printable(self.path) + (f":{line}" if line is not None else "")
        super().__init__(f"{where}: {reason}")


def describe_size(n: int) -> str:
    """``16 MiB``, ``512 KiB``, ``100 bytes``: a bound as a message states it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, as a message names it (``a FIFO (named pipe)``)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _not_regular(path: str | Path, mode: int, what: str) -> UnreadableFileError:
    kind = file_kind(mode)
    if stat.S_ISDIR(mode):
        return UnreadableFileError(path, f"is a directory, not a {what}", "not_regular")
    return UnreadableFileError(
        path,
        f"is {kind}, not a regular file; a {what} must be a regular file (save it to one)",
        "not_regular",
    )


def _os_error(path: str | Path, exc: OSError, what: str) -> UnreadableFileError:
    if exc.errno == errno.ENOENT:
        return UnreadableFileError(path, f"no such {what}", "missing")
    if exc.errno == errno.ENOTDIR:
        return UnreadableFileError(
            path, f"no such {what} (a part of the path is not a directory)", "missing"
        )
    if exc.errno == errno.ELOOP:
        return UnreadableFileError(
            path, "is a symbolic link that loops (or a chain of links too long)", "refused"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return UnreadableFileError(
            path, f"cannot be read (permission denied); check the {what}'s permissions", "refused"
        )
    return UnreadableFileError(path, f"cannot be read ({exc.strerror or exc})", "refused")


def open_regular(path: str | Path, what: str = "file") -> BinaryIO:
    """``path`` opened for reading (buffered, binary) when it is a regular file, else an
    :class:`UnreadableFileError` naming what it is instead (``what`` names the kind of
    file the caller wanted, ``"pool file"``).  Symbolic links are followed."""
    try:
        # Checked before opening: opening a FIFO waits for a writer, and opening some
        # devices acts (a tape rewinds, a watchdog arms).
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _os_error(path, exc, what) from None
    except ValueError:  # a NUL byte in the path
        raise UnreadableFileError(
            path, f"no such {what} (the path holds a NUL byte)", "missing"
        ) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, what)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _os_error(path, exc, what) from None
    try:
        # Checked again on what was opened: the path may have been replaced meanwhile.
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, what)
        return io.BufferedReader(io.FileIO(fd, "rb", closefd=True))
    except BaseException:
        os.close(fd)
        raise


def is_regular(path: str | Path) -> bool:
    """Whether ``path`` is (or links to) a regular file; never raises (a name too long,
    a NUL byte or a looping link is simply not one), unlike ``Path.is_file``."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def resolved(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute with its symbolic links followed (as ``Path.resolve``); a
    link that loops is an :class:`UnreadableFileError` rather than the ``RuntimeError``
    (``OSError`` on newer Pythons) ``resolve`` raises."""
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError):
        raise UnreadableFileError(
            os.fspath(path),
            "is a symbolic link that loops (or a chain of links too long)",
            "refused",
        ) from None


def check_regular(path: str | Path, what: str = "file") -> None:
    """Refuse ``path`` now, as :func:`open_regular` would when it is read later (a
    command that checks every path before it starts)."""
    open_regular(path, what).close()


def check_appendable(path: str | Path, what: str = "file") -> None:
    """Refuse ``path`` for appending when something other than a regular file is there
    (opening a FIFO to write waits for a reader; a device would take the lines); a
    path with nothing there is fine: it will be created."""
    if not os.path.lexists(path):
        return
    check_regular(path, what)


def _read_block(fh: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes of ``fh``; ``b""`` at its end, and at a file that would wait
    for data (it was opened ``O_NONBLOCK``: see the module's docstring)."""
    try:
        data = fh.read(size)
    except BlockingIOError:
        return b""
    return data or b""


def read_regular(path: str | Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refused (without being read past
    ``limit`` bytes) when it holds more than ``limit``."""
    with open_regular(path, what) as fh:
        chunks: list[bytes] = []
        held = 0
        while held <= limit:
            block = _read_block(fh, min(LINE_READ_BLOCK * 16, limit + 1 - held))
            if not block:
                break
            chunks.append(block)
            held += len(block)
    if held > limit:
        raise UnreadableFileError(
            path, f"holds more than {describe_size(limit)}, more than a {what} may hold", "too_big"
        )
    return b"".join(chunks)


def utf8_text(data: bytes, path: str | Path, what: str, first_line: int = 1) -> str:
    """``data`` (read from ``path``, starting at line ``first_line``) as UTF-8 text; a
    byte that is not UTF-8 is refused naming its line and value."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise UnreadableFileError(
            path,
            f"is not UTF-8 text (byte {data[exc.start]:#04x} cannot start or continue a "
            f"character); save the {what} as UTF-8",
            "not_utf8",
            line,
        ) from None


def parse_json(text: str | bytes, path: str | Path, line: int | None = None) -> Any:
    """The JSON value of ``text`` (read from ``path``; ``line`` the line it starts on,
    for a line of a JSONL file).  Every way ``json.loads`` fails is one sentence naming
    the line: a syntax error, nesting deeper than the parser recurses, and a number of
    thousands of digits (``int()`` refuses it with a ``ValueError`` of its own)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = exc.lineno if line is None else line + exc.lineno - 1
        raise UnreadableFileError(path, f"not valid JSON ({exc.msg})", "not_json", at) from None
    except RecursionError:
        raise UnreadableFileError(
            path, "not valid JSON (nested too deeply)", "not_json", line
        ) from None
    except ValueError as exc:
        # int() refuses numbers of thousands of digits (its own guard against slow
        # conversions), and says so in a sentence too long to repeat.
        digits = sys.get_int_max_str_digits()
        why = f"a number of more than {digits:,} digits" if "digits" in str(exc) else str(exc)
        raise UnreadableFileError(path, f"not valid JSON ({why})", "not_json", line) from None


def read_text(path: str | Path, what: str, limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``limit`` bytes; a leading
    byte-order mark is dropped: some editors write one)."""
    text = utf8_text(read_regular(path, what, limit), path, what)
    return text.removeprefix("\ufeff")


def bounded_lines(fh: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None]]:
    """``(line number, bytes)`` of each line of ``fh`` (from 1, its newline kept), or
    ``(line number, None)`` for a line of more than ``limit`` bytes before its newline.
    A line is read in blocks, so such a line costs at most ``limit`` bytes held (then
    dropped) and the rest of it is skipped a block at a time, never read whole; a line
    within the bound is held twice at most, while its blocks are joined.  The last line
    may lack its newline (a torn write)."""
    block = max(1, min(LINE_READ_BLOCK, limit + 1))
    number = 0
    while True:
        piece = _readline(fh, block)
        if not piece:
            return
        number += 1
        pieces = [piece]
        held = len(piece)
        # More of the line while it goes on and is still within the bound (its newline
        # may be the one byte past the bound).
        while not piece.endswith(b"\n") and held <= limit:
            piece = _readline(fh, block)
            if not piece:
                break
            pieces.append(piece)
            held += len(piece)
        line_length = held - piece.endswith(b"\n")
        if line_length <= limit:
            yield number, pieces[0] if len(pieces) == 1 else b"".join(pieces)
            continue
        pieces.clear()
        while piece and not piece.endswith(b"\n"):  # the rest, dropped a block at a time
            piece = _readline(fh, LINE_READ_BLOCK)
        yield number, None


def _readline(fh: BinaryIO, size: int) -> bytes:
    try:
        return fh.readline(size)
    except BlockingIOError:  # opened O_NONBLOCK: see the module's docstring
        return b""
