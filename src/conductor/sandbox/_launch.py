"""Start the sandbox's first process, read what it writes through bounded pipes, enforce
the wall-clock limit and kill everything at the end (every engine does it this way).

Why pipes and not files: a file on the host's disk would let the program fill that
disk, and reading it back whole is what made 4 MB of control bytes per test grow the
grading process from 19 to 751 MB.  Each pipe here is drained as it fills: up to its
cap is kept, the rest is read and dropped at once, so the program never blocks on a
full pipe and the parent holds at most the caps.  The report channel is parsed line by
line as it arrives, a line over its cap is skipped without being held.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Launched", "Started", "launch", "start"]

_CHUNK = 1 << 16


class _Capped:
    """The first ``limit`` bytes of a stream; the rest is counted and dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def feed(self, data: bytes) -> None:
        room = self.limit - self.kept
        if len(data) > room:
            self.truncated = True
            data = data[: max(0, room)]
        if data:
            self.parts.append(data)
            self.kept += len(data)

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", "replace")


class _Lines:
    """Whole lines handed to ``on_line`` as they arrive; a line longer than ``limit`` is
    dropped as it streams (only ``limit`` bytes of a partial line are ever held), and
    at most ``total`` bytes of lines are handed on in all."""

    def __init__(self, on_line: Callable[[bytes], None], limit: int, total: int) -> None:
        self.on_line = on_line
        self.limit = limit
        self.left = total
        self.buf = bytearray()
        self.skipping = False
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if not self.skipping:
                if len(self.buf) + len(piece) > self.limit:
                    self.skipping = True
                    self.buf.clear()
                else:
                    self.buf += piece
            if end < 0:
                return
            if self.skipping:
                self.dropped += 1
            elif len(self.buf) > self.left:
                self.dropped += 1
                self.left = 0
            else:
                self.left -= len(self.buf)
                self.on_line(bytes(self.buf))
            self.buf.clear()
            self.skipping = False
            start = end + 1


@dataclass
class Launched:
    """How the first process ended and what came out of it."""

    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    dropped_report_lines: int


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # The whole group, in every case: the run is over and nothing of it may linger.  The
    # engines add a PID namespace, whose every process dies with its first one.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


class Started:
    """A started first process whose output pipes are not read yet: what
    :func:`start` returns, run to its end by :meth:`collect` or killed by
    :meth:`discard`.  (A warm sandbox waits as one of these for its job.)"""

    def __init__(self, proc: subprocess.Popen[bytes], out_r: int, err_r: int) -> None:
        self.proc = proc
        self.out_r = out_r
        self.err_r = err_r
        self._open = True

    def alive(self) -> bool:
        """Whether the process is still running (a warm sandbox that died is not used)."""
        return self._open and self.proc.poll() is None

    def discard(self) -> None:
        """Kill the whole run and close its pipes (idempotent)."""
        if not self._open:
            return
        self._open = False
        _kill(self.proc)
        self.proc.wait()
        for fd in (self.out_r, self.err_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def collect(
        self,
        *,
        report: tuple[int, Callable[[bytes], None], int, int] | None,
        output_limit: int,
        wall_time_s: float,
        feed: tuple[int, bytes] | None = None,
        replies: Callable[[], bytes] | None = None,
    ) -> Launched:
        """Read the run's pipes until its first process ends, at most ``wall_time_s``
        from now, then kill everything of it.

        ``report`` as for :func:`launch`; ``feed`` is (the write end of a pipe the run
        reads, the bytes to write there): written as the pipe takes them, then closed, so
        that a run that does not read cannot block the caller past the deadline.  With
        ``replies``, the pipe stays open after those bytes: what ``replies`` returns,
        asked after each read of the run's pipes (the report lines it answers have been
        handed on by then), is written there too.  Every fd given here is closed by the
        time this returns or raises.
        """
        if not self._open:
            raise RuntimeError("this run was already collected or discarded")
        self._open = False
        proc = self.proc
        out, err = _Capped(output_limit), _Capped(output_limit)
        sinks: dict[int, Callable[[bytes], None]] = {self.out_r: out.feed, self.err_r: err.feed}
        lines: _Lines | None = None
        if report is not None:
            lines = _Lines(report[1], report[2], report[3])
            sinks[report[0]] = lines.feed
        to_write = bytearray(feed[1]) if feed is not None else bytearray()
        writer = feed[0] if feed is not None else -1
        if writer >= 0:
            os.set_blocking(writer, False)
        deadline = time.monotonic() + max(0.1, wall_time_s)
        timed_out = False
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = -1
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                # with every pipe closed there is still the process to wait for
                waits = [*sinks, *([pidfd] if pidfd >= 0 else [])]
                # an open pipe with nothing to send is not waited on (it is always writable)
                writes = [writer] if writer >= 0 and to_write else []
                wait_s = min(left, 0.05 if pidfd < 0 else left)
                ready, can_write, _ = select.select(waits, writes, [], wait_s)
                if can_write:
                    try:
                        sent = os.write(writer, to_write[: 1 << 16])
                    except BlockingIOError:
                        sent = 0
                    except OSError:  # the run no longer reads (it ended): nothing to send
                        sent = len(to_write)
                    del to_write[:sent]
                    if not to_write and replies is None:
                        os.close(writer)
                        writer = -1
                for fd in ready:
                    if fd == pidfd:
                        continue
                    data = os.read(fd, _CHUNK)
                    if data:
                        sinks[fd](data)
                    else:
                        del sinks[fd]
                        os.close(fd)
                if replies is not None and writer >= 0:
                    to_write += replies()
                if pidfd in ready or (pidfd < 0 and proc.poll() is not None):
                    # The first process ended: what its children still hold open must not
                    # keep the run going; drain what is already buffered, then stop.
                    _drain(sinks)
                    break
        finally:
            _kill(proc)
            proc.wait()
            for fd in [*sinks, *([writer] if writer >= 0 else [])]:
                os.close(fd)
            if pidfd >= 0:
                os.close(pidfd)
        return Launched(
            returncode=None if timed_out else proc.returncode,
            timed_out=timed_out,
            stdout=out.text(),
            stderr=err.text(),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            dropped_report_lines=lines.dropped if lines is not None else 0,
        )


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    stdin_fd: int,
    pass_fds: Sequence[int],
) -> Started:
    """Start ``argv`` in a new session with ``stdin_fd`` as its standard input and
    ``pass_fds`` as the only other fds it inherits (every other one is closed); its
    stdout and stderr are pipes read by :meth:`Started.collect`.  The parent's copies of
    ``pass_fds`` are closed by the time this returns or raises."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=stdin_fd,
            stdout=out_w,
            stderr=err_w,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            close_fds=True,
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        # the parent's copies of the child's ends: EOF comes once the child's are closed
        for fd in (out_w, err_w, *pass_fds):
            with contextlib.suppress(OSError):
                os.close(fd)
    return Started(proc, out_r, err_r)


def launch(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    stdin_fd: int,
    pass_fds: Sequence[int],
    report: tuple[int, Callable[[bytes], None], int, int] | None,
    output_limit: int,
    wall_time_s: float,
) -> Launched:
    """Run ``argv`` and wait for it, at most ``wall_time_s`` (:func:`start`, then
    :meth:`Started.collect`).

    ``report`` is (the read end of the report pipe, whose write end is in ``pass_fds``;
    the function each line goes to; the longest line kept; the bytes of lines kept in
    all).  Every fd given here is closed by the time this returns or raises.
    """
    try:
        started = start(argv, env=env, cwd=cwd, stdin_fd=stdin_fd, pass_fds=pass_fds)
    except BaseException:
        if report is not None:
            os.close(report[0])
        raise
    return started.collect(report=report, output_limit=output_limit, wall_time_s=wall_time_s)


def _drain(sinks: dict[int, Callable[[bytes], None]]) -> None:
    """Read what the pipes hold now, without waiting for writers that are still alive
    (a bounded number of reads: a writer left behind may keep writing)."""
    for fd in list(sinks):
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError, OSError):
            for _ in range(64):
                data = os.read(fd, _CHUNK)
                if not data:
                    break
                sinks[fd](data)
