"""A bench run directory: the names of its files, and the one reader of ``samples.jsonl``.

::

    DIR/config.json        what was run (the runner writes it; resume, merge, report read it)
    DIR/samples.jsonl      one run record per finished (sample, epoch), appended as each
                           ends: a process killed mid-write leaves a torn last line
    DIR/summary.json       the scores (:mod:`conductor.runs.summary`)
    DIR/rate_limits.json   each invocation's adaptive rate-limit history per provider key
    DIR/batches.jsonl      the provider batches a ``--batch`` run submitted, written before
                           and after each submission (:mod:`conductor.runs.batches`)
    DIR/state_token        with ``--state``: the run's session on the state server, which
                           the processes that join the run find it by
    DIR/.lock              held by the one process writing the directory (with
                           ``--state``, shared by the processes that joined the run)

The directory is ``0700`` and every file in it ``0600`` whatever the umask (the records
hold prompts, answers and grades; :mod:`conductor.private` creates them), and a run
directory an older version left readable is tightened when a run opens it again.

Every reader of ``samples.jsonl`` (resume, merge, the report, ``conductor trace``) goes
through :class:`SampleLines`, so they agree on what the file holds: a blank line is
nothing (processes sharing a run with ``--state`` start each record with one, so a
line torn by one of them is ended before the next record; see
:mod:`conductor.bench.shared`), and a line that is not a JSON object (a torn last
line, a line garbled on disk) is skipped with a warning naming it, and counted.  A
(sample, epoch) recorded twice (a resume after ``--retry-errors``, merged shards)
counts once, its last record: :func:`latest_lines`.  The list of a run's samples reads
each record without its rounds' calls (:func:`iter_heads`): what it shows is checked as
a whole record's reading checks it; a fault inside a call is named by ``conductor trace
--sample``, which reads that record whole.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import RecordError, UsageError
from ..private import open_private, temps_left
from ..record import MAX_RECORD_BYTES, RunRecord, record_from_dict
from ..redact import SECRETS
from ..userfiles import (
    UnreadableFileError,
    bounded_lines,
    check_appendable,
    describe_size,
    is_regular,
    open_regular,
)

__all__ = [
    "BATCHES",
    "CONFIG",
    "LOCK",
    "RATE_LIMITS",
    "RUN_FILES",
    "SAMPLES",
    "STATE_TOKEN",
    "SUMMARY",
    "SampleLines",
    "find_sample",
    "clear_run",
    "iter_records",
    "iter_heads",
    "latest_lines",
    "numbered_records",
    "open_samples",
    "record_line",
    "record_of",
    "repair_tail",
    "run_dirs",
    "sample_dirs",
    "sample_key",
    "steps_run",
    "write_line",
]

log = logging.getLogger("conductor")

CONFIG = "config.json"
SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
RATE_LIMITS = "rate_limits.json"
BATCHES = "batches.jsonl"
STATE_TOKEN = "state_token"
LOCK = ".lock"
#: Everything a bench run writes in its directory besides the lock (the temporary files
#: are what an atomic replace of an earlier version left when a process was killed in
#: the middle of one; now each replace has a temporary file of its own: ``temps_left``).
RUN_FILES = (
    CONFIG,
    SAMPLES,
    SUMMARY,
    RATE_LIMITS,
    BATCHES,
    STATE_TOKEN,
    f"{SAMPLES}.tmp",
    f".{SUMMARY}.tmp",
    f".{RATE_LIMITS}.tmp",
    f".{STATE_TOKEN}.tmp",
)


def sample_key(data: dict[str, Any], number: int = 0) -> tuple[str, int]:
    """The (sample id, epoch) a record line is about.  A line without a sample id is
    its own key (``number`` is its line), so it is never taken for a duplicate."""
    sample = data.get("sample_id")
    try:
        epoch = int(data.get("epoch") or 0)
    except (TypeError, ValueError):
        epoch = 0
    return (str(sample) if sample is not None else f"line {number}", epoch)


class SampleLines:
    """The records of one ``samples.jsonl`` as ``(line number, JSON object)``, in file
    order, read one line at a time (a run of any size is never held whole).

    Iterate it once per pass; ``skipped`` counts the lines the last pass left out, and
    ``last_line`` is the number of the last line it read.  A missing file has no lines.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.skipped = 0
        self.last_line = 0

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        self.skipped = 0
        self.last_line = 0
        if not os.path.lexists(self.path):
            return
        try:
            # A regular file only (a FIFO would wait, a device never end), one line at
            # a time with a bound (a line of gigabytes is skipped, not held).
            fh = open_regular(self.path, "samples file")
        except UnreadableFileError as exc:
            raise RecordError(str(exc)) from None
        with fh:
            for number, raw in bounded_lines(fh, MAX_RECORD_BYTES):
                self.last_line = number
                if raw is None:
                    self.skipped += 1
                    log.warning(
                        "%s:%d: skipped a line longer than %s (not a run record)",
                        self.path,
                        number,
                        describe_size(MAX_RECORD_BYTES),
                    )
                    continue
                if not raw.strip():
                    continue
                data = self._parse(raw, number)
                if data is not None:
                    yield number, data

    def _parse(self, raw: bytes, number: int) -> dict[str, Any] | None:
        where = f"{self.path}:{number}"
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8, a 5,000-digit number
            self.skipped += 1
            if not raw.endswith(b"\n"):
                log.warning("%s: skipped a torn last line (a run cut short?)", where)
            else:
                log.warning("%s: skipped a line that is not a JSON record (%s)", where, exc)
            return None
        if not isinstance(data, dict):
            self.skipped += 1
            log.warning("%s: skipped a line that is not a JSON object", where)
            return None
        return data


def latest_lines(lines: SampleLines) -> set[int]:
    """The line numbers holding the last record of each (sample, epoch): one pass that
    keeps only the keys, so a second pass can pick those lines out."""
    last: dict[tuple[str, int], int] = {}
    for number, data in lines:
        last[sample_key(data, number)] = number
    return set(last.values())


def iter_records(path: str | Path, *, latest: bool = False) -> Iterator[RunRecord]:
    """The run records of ``samples.jsonl`` in file order (``latest``: only the last
    record of each (sample, epoch)).  A line that is JSON but not a run record is an
    error naming its line (:class:`~conductor.errors.RecordError`)."""
    lines = SampleLines(path)
    if not os.path.lexists(lines.path):
        raise RecordError(f"{lines.path}: no such file")
    keep = latest_lines(lines) if latest else None
    for _number, record in numbered_records(lines, keep):
        yield record


#: The statuses a step may have (``StepRecord.status``): a step of any other is left to
#: the whole record's reading, which names the error.
_STEP_STATUSES = ("ok", "failed", "skipped")


def iter_heads(path: str | Path) -> Iterator[tuple[RunRecord, int]]:
    """Each record of ``samples.jsonl`` in file order without its rounds (``rounds`` is
    empty), with how many of its steps ran (not skipped): what a list of the samples
    shows, read in a fraction of the time it takes to build every call of every step.

    The fields kept are checked as :func:`iter_records` checks them (the same errors,
    naming the line); of the rounds only the shape the count reads (lists of objects, a
    known step status); a record whose rounds are not of that shape is read whole, so
    that its error is the one :func:`iter_records` gives.  A fault deeper in a step (a
    call's field of the wrong type) is not looked for: ``conductor trace --sample``
    reads that record whole and names it.
    """
    lines = SampleLines(path)
    if not os.path.lexists(lines.path):
        raise RecordError(f"{lines.path}: no such file")
    for number, data in lines:
        rounds = data.get("rounds")
        steps = _steps_run(rounds)
        if steps is None:
            record = record_of(lines.path, number, data)
            yield record, steps_run(record)
            continue
        yield record_of(lines.path, number, {**data, "rounds": []}), steps


def steps_run(record: RunRecord) -> int:
    """How many steps of ``record`` ran (were not skipped)."""
    return sum(1 for rnd in record.rounds for s in rnd.steps if s.status != "skipped")


def _steps_run(rounds: Any) -> int | None:
    """How many steps of ``rounds`` (a record's, as read from JSON) ran; ``None`` where
    they are not lists of objects with a known status (the record is then read whole)."""
    if not isinstance(rounds, list):
        return None
    count = 0
    for rnd in rounds:
        if not isinstance(rnd, dict):
            return None
        steps = rnd.get("steps", [])
        if not isinstance(steps, list):
            return None
        for step in steps:
            if not isinstance(step, dict):
                return None
            status = step.get("status", "ok")
            if status not in _STEP_STATUSES or not isinstance(status, str):
                return None
            count += status != "skipped"
    return count


def numbered_records(
    lines: SampleLines, keep: set[int] | None = None
) -> Iterator[tuple[int, RunRecord]]:
    """``(line number, run record)`` of ``lines`` (only the line numbers in ``keep``,
    when given).  A line that is JSON but not a run record is an error naming its line
    (:class:`~conductor.errors.RecordError`)."""
    for number, data in lines:
        if keep is None or number in keep:
            yield number, record_of(lines.path, number, data)


def record_of(path: Path, number: int, data: dict[str, Any]) -> RunRecord:
    """The run record ``data`` read from line ``number`` of ``path``; an error
    (:class:`~conductor.errors.RecordError`) names the line."""
    try:
        return record_from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{path}:{number}: {exc}") from None


def run_dirs(path: Path, holding: str = CONFIG) -> list[Path]:
    """The bench run directories ``path`` stands for, found by the file ``holding``:
    ``path`` itself, or, for a ``singles`` run, its ``single-WORKER`` directories
    (sorted by name); none when it holds neither."""
    if os.path.lexists(path / holding):  # what it is, its reader checks and names
        return [path]
    return sorted(p.parent for p in path.glob(f"single-*/{holding}"))


def sample_dirs(path: Path) -> list[Path]:
    """:func:`run_dirs` holding a ``samples.jsonl``; a :class:`UsageError` when none does."""
    dirs = run_dirs(path, holding=SAMPLES)
    if not dirs:
        raise UsageError(f"{path}: no {SAMPLES} in this run directory")
    return dirs


def find_sample(path: Path, sample: str) -> list[tuple[Path, RunRecord]]:
    """The records of ``sample`` (a sample id or a run id) in the run directories ``path``
    stands for, each with its directory, in directory order and then by epoch.

    Raises :class:`UsageError` naming close ids when there is none.
    """
    dirs = sample_dirs(path)
    found: list[tuple[Path, RunRecord]] = []
    ids: set[str] = set()
    for d in dirs:
        lines = SampleLines(d / SAMPLES)
        if not os.path.lexists(lines.path):
            raise RecordError(f"{lines.path}: no such file")
        # Only the sample's own lines are read as records: building all 100,000 records
        # of a run to show one took ten seconds.
        for number, data in lines:
            sample_id, run_id = data.get("sample_id"), data.get("run_id")
            if isinstance(sample_id, str):
                ids.add(sample_id)
            if sample in (sample_id, run_id):
                found.append((d, record_of(lines.path, number, data)))
    if not found:
        raise _unknown_sample(path, sample, ids)
    # Records are written as samples finish; a sample's epochs are shown in order.
    found.sort(key=lambda item: (dirs.index(item[0]), item[1].epoch or 0))
    return found


def _unknown_sample(run: Path, sample: str, ids: set[str]) -> UsageError:
    import difflib

    listing = f"conductor trace {run} lists them"
    if not ids:
        return UsageError(f"{run}: no sample {sample!r}; this run holds no samples yet")
    # Part of an id (``3.json`` for ``math500/test/3.json``) is the likely slip; a
    # misspelling of a whole id the next.
    close = sorted(i for i in ids if sample in i)
    if not 1 <= len(close) <= 3:
        close = difflib.get_close_matches(sample, sorted(ids), n=3, cutoff=0.6)
    guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    count = f"{len(ids)} sample" + ("" if len(ids) == 1 else "s")
    return UsageError(f"{run}: no sample {sample!r} among its {count}{guess} ({listing})")


def clear_run(path: Path) -> list[str]:
    """Delete the files a bench run wrote in ``path`` (:data:`RUN_FILES`; nothing else
    there, and not the lock); return the names deleted."""
    removed = []
    # With the temporary files a writer killed mid-write left (each writer names its own).
    left = [p.name for name in RUN_FILES for p in temps_left(path / name)]
    for name in (*RUN_FILES, *left):
        try:
            (path / name).unlink()
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed


def repair_tail(path: Path) -> None:
    """Cut a torn last line (a process killed mid-write) so appends stay line-aligned."""
    if not is_regular(path) or path.stat().st_size == 0:
        return  # nothing to cut (what is not a file, its reader or writer refuses)
    with path.open("rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        # Walk back to the last newline and truncate after it.
        size = fh.seek(0, os.SEEK_END)
        chunk = 1 << 16
        pos = size
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step)
            idx = data.rfind(b"\n")
            if idx != -1:
                fh.truncate(pos + idx + 1)
                return
        fh.truncate(0)


def open_samples(path: Path) -> IO[bytes]:
    """The samples file, opened unbuffered for appending: a failed write leaves nothing
    in a buffer to be written later by someone else.  Anything there but a regular file
    is refused (a FIFO's open would wait for a reader)."""
    check_appendable(path, "samples file")
    return open_private(path, "ab", buffering=0)


def write_line(fh: IO[bytes], line: str) -> None:
    """Write all of ``line`` (a short write is retried; nothing written is an error)."""
    data = line.encode("utf-8")
    while data:
        written = fh.write(data)
        if not written:
            raise OSError(errno.EIO, "short write")
        data = data[written:]


def record_line(data: dict[str, Any]) -> str:
    """One JSON line for ``data``, every secret value of this process masked (the one
    line writer of ``samples.jsonl``, serve's records and ``batches.jsonl``).  Text
    that is not valid Unicode (a lone surrogate read from the data) is written as
    ``\\u`` escapes, so it neither fails the write nor is altered on reading back."""
    data = SECRETS.masker().data(data, str)
    line = json.dumps(data, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(data, ensure_ascii=True, default=str)
    return line + "\n"
