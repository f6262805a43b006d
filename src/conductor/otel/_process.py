"""The tracer a command holds: a :class:`~conductor.otel._export.RecordTracer` in a child
process of its own (:mod:`._child`).

Making SDK spans and encoding them as protobuf costs about 1.5 ms of CPU per question
(10 spans), which in the run's own process competed with the event loop for the GIL:
a bench on a fast provider ran 13-20% slower.  Here the run's process only hands each
record over, as the JSON line it writes anyway (``bench``) or encodes once, through a
pipe; the child reads it back, makes the spans and sends them.  A child that crashes or
is killed costs the run nothing but its spans, and the report says so; a run that dies
closes the pipe, and the child sends what it holds and ends.  OpenTelemetry is imported
only in the child.

The child is ``python -m conductor.otel._child``, not a :mod:`multiprocessing` process:
``spawn`` re-runs the caller's main script (a user's script without a ``__main__`` guard
would fail), and ``fork`` copies a process that runs threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..redact import mask_text, masked_json
from ._config import OtelSettings
from ._report import TraceReport

if TYPE_CHECKING:
    from ..record import RunRecord

__all__ = ["CLOSE_TIMEOUT_S", "MAX_QUEUED_RECORDS", "ProcessTracer"]

#: Records waiting for the pipe beyond which new ones are dropped (counted): a receiver
#: slower than the run must not grow the run's memory without bound.
MAX_QUEUED_RECORDS = 20_000
#: How long the child waits for the receiver when closing; the parent waits a little more.
CLOSE_TIMEOUT_S = 30.0
_GRACE_S = 15.0
#: Lines written to the pipe at once.
_CHUNK = 256
#: What the child said on stderr that a report keeps, when it ended without a report.
_STDERR_TAIL = 300


class ProcessTracer:
    """Sends each record given to :meth:`emit` as a trace, from a child process."""

    def __init__(self, settings: OtelSettings, *, close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self.settings = settings
        self._close_timeout_s = close_timeout_s
        self._dir = Path(tempfile.mkdtemp(prefix="conductor-otel-"))
        self._report_path = self._dir / "report.json"
        self._stderr = open(self._dir / "stderr.txt", "wb")  # noqa: SIM115 - closed in close()
        self._lines: queue.Queue[bytes | None] = queue.Queue(maxsize=MAX_QUEUED_RECORDS)
        self._records = 0
        self._dropped = 0
        self._broken = False
        self._closed: TraceReport | None = None
        #: Why the child could not be started; its records are then only counted: a run
        #: is never failed by its traces.
        self._not_started: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "conductor.otel._child",
                    json.dumps(dataclasses.asdict(settings)),
                    str(self._report_path),
                    repr(close_timeout_s),
                ],
                stdin=subprocess.PIPE,
                stdout=None,  # the console exporter writes spans to the terminal
                stderr=self._stderr,
                env=_child_env(),
                close_fds=True,
            )
        except OSError as exc:  # no runnable interpreter, no process or file left
            self._not_started = (
                f"the process sending spans could not be started ({exc.strerror or exc})"
            )
            self._broken = True
        self._pipe: IO[bytes] | None = self._process.stdin if self._process else None
        self._writer = threading.Thread(target=self._write, name="conductor-otel-pipe", daemon=True)
        if self._pipe is not None:
            self._writer.start()

    @property
    def report(self) -> TraceReport | None:
        """What was done, once :meth:`close` has returned (``None`` before)."""
        return self._closed

    @property
    def pid(self) -> int | None:
        """The child's process id (``None`` when it could not be started)."""
        return self._process.pid if self._process is not None else None

    def emit(
        self,
        record: RunRecord,
        *,
        source: str | None = None,
        traceparent: str | None = None,
        line: str | None = None,
    ) -> None:
        """Hand ``record`` over (``line``: its JSON, one line, when the caller has it),
        every secret value of this process masked: the spans leave the process."""
        self._records += 1
        if self._closed is not None or self._broken:
            self._dropped += 1
            return
        if line is None:
            from ..record import record_to_dict

            line = masked_json(record_to_dict(record), ensure_ascii=False)
        else:
            line = mask_text(line)
        # JSON escapes tabs and newlines inside strings, so the first raw tab ends the
        # header, and a raw newline in a record can only be white space: the one at
        # the end ends the record.
        head = json.dumps([source, traceparent], ensure_ascii=False)
        body = line.strip().replace("\n", " ")
        try:
            # A lone surrogate (a provider's JSON can carry one) only occurs inside a
            # string, where its backslash escape reads back as the same character.
            self._lines.put_nowait(f"{head}\t{body}\n".encode(errors="backslashreplace"))
        except queue.Full:
            self._dropped += 1

    def _write(self) -> None:
        pipe = self._pipe
        assert pipe is not None
        done = False
        while not done:
            chunk = [self._lines.get()]
            while len(chunk) < _CHUNK:
                try:
                    chunk.append(self._lines.get_nowait())
                except queue.Empty:
                    break
            done = chunk[-1] is None
            data = b"".join(c for c in chunk if c is not None)
            try:
                pipe.write(data)
                pipe.flush()
            except (OSError, ValueError):  # the child is gone
                self._broken = True
                break
        with contextlib.suppress(OSError, ValueError):
            pipe.close()  # end of input: the child sends what it holds and reports

    def close(self) -> TraceReport:
        """Let the child send what it holds (waiting for the receiver as long as the
        tracer was told) and return what was done."""
        if self._closed is not None:
            return self._closed
        if self._process is None:
            self._stderr.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            report = TraceReport(self.settings.describe(), records=self._records)
            report.unplanned = self._records
            report.reason = self._not_started
            self._closed = report
            return report
        wait_s = self._close_timeout_s + _GRACE_S
        with contextlib.suppress(queue.Full):
            self._lines.put(None, timeout=wait_s)
        self._writer.join(wait_s)
        try:
            self._process.wait(wait_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stderr.close()
        report = self._read_report()
        report.records = max(report.records, self._records)
        if self._dropped:
            report.unplanned += self._dropped
            report.reason = report.reason or "records came faster than they could be sent"
        shutil.rmtree(self._dir, ignore_errors=True)
        self._closed = report
        return report

    def _read_report(self) -> TraceReport:
        try:
            return TraceReport(**json.loads(self._report_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            pass
        report = TraceReport(self.settings.describe(), records=self._records)
        report.unplanned = self._records
        assert self._process is not None
        code = self._process.returncode
        said = ""
        with contextlib.suppress(OSError):
            lines = (self._dir / "stderr.txt").read_text(errors="replace").strip().splitlines()
            said = f": {lines[-1][:_STDERR_TAIL]}" if lines else ""
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else (f"ended with exit code {code}")
        )
        report.reason = f"the process sending spans {how} without a report{said}"
        return report


def _child_env() -> dict[str, str]:
    """The environment, with this copy of conductor first on the path: the child must
    import the same code, however the parent found it (an install, a checkout)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
