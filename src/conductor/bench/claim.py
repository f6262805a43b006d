"""Taking a run directory for a bench run, and the work left in it.

:func:`claim_run_dir` makes a locked directory the run's: ``--overwrite`` deletes the
run there (only a bench run's files, checked by :func:`check_overwritable` before the
lock and again under it), records of another run are refused (naming the difference,
and whether ``--resume`` or ``--overwrite`` would do), a resume must continue the same
run, and a fresh run writes ``config.json``.  :func:`check_claim` is its refusals
alone, read only (for a spend estimate).  :func:`completed_keys` reads what is
recorded already (first dropping failed records for ``--retry-errors``), and
:func:`remaining_work` streams this shard's (sample, epoch) pairs still to run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

from ..benchmark import BenchmarkSpec
from ..datasets.samples import count_samples, iter_samples
from ..errors import UsageError
from ..grading.types import Sample
from ..private import open_private, write_private
from ..runs.config import BenchConfig, read_run_config
from ..runs.lock import holds_records
from ..runs.rundir import (
    CONFIG,
    RUN_FILES,
    SAMPLES,
    SampleLines,
    clear_run,
    record_line,
    repair_tail,
    sample_key,
)
from ..text import plural
from .faults import io_stop
from .runconfig import BenchOptions, check_same_run, run_difference

__all__ = [
    "check_claim",
    "check_join",
    "check_overwritable",
    "claim_run_dir",
    "completed_keys",
    "is_error_record",
    "recorded_keys",
    "remaining_work",
    "trained_count",
]


def is_error_record(data: dict[str, Any]) -> bool:
    """Whether the record ``data`` is of a failed run or a grader error (what
    ``--retry-errors`` runs again, and what the sample cache never keeps)."""
    grade = data.get("grade") or {}
    return data.get("status") == "failed" or grade.get("status") == "grader_error"


def completed_keys(out_dir: Path, *, drop_errors: bool = False) -> set[tuple[str, int]]:
    """The (sample, epoch) pairs recorded in ``out_dir``; with ``drop_errors`` the records
    of failed runs are first removed from the file (atomically) so they can run again."""
    path = out_dir / SAMPLES
    repair_tail(path)
    lines = SampleLines(path)
    if drop_errors and path.exists():
        tmp = path.with_suffix(".jsonl.tmp")
        with open_private(tmp, "w", encoding="utf-8") as out:
            for _number, data in lines:
                if not is_error_record(data):
                    out.write(record_line(data))
        tmp.replace(path)
    return {sample_key(data) for _number, data in lines}


def recorded_keys(out_dir: Path, *, drop_errors: bool = False) -> set[tuple[str, int]]:
    """The (sample, epoch) pairs recorded in ``out_dir``, read only (a torn last line is
    skipped, not cut off); with ``drop_errors``, not those whose record is of a failed
    run (what ``--retry-errors`` runs again)."""
    lines = SampleLines(out_dir / SAMPLES)
    return {
        sample_key(data) for _number, data in lines if not (drop_errors and is_error_record(data))
    }


def _recorded_pairs(out_dir: Path) -> int:
    """How many (sample, epoch) pairs ``out_dir`` holds a record of (read only)."""
    return len(recorded_keys(out_dir))


def _total_pairs(
    spec: BenchmarkSpec, options: BenchOptions, epochs: int, config: BenchConfig
) -> int:
    """How many (sample, epoch) pairs this shard of the run has in all."""
    # Rows are counted, not decoded, so the count costs little.
    n = count_samples(spec, data_file=options.data_file, limit=options.limit)
    shard_i, shard_n = options.shard or (0, 1)
    total = len(range(shard_i, n, shard_n)) * epochs
    if options.exclude_trained:
        trained = config.trained_on.samples if config.trained_on is not None else None
        total -= (trained or 0) * epochs
    return total


def _occupied(out: Path, difference: str | None, recorded: int, total: int) -> UsageError:
    """Why a run without ``--resume`` does not start in ``out``, which holds records,
    and what the user can do instead."""
    if difference is not None:
        return UsageError(
            f"{out} already holds another run ({difference}); choose another --out, or "
            "pass --overwrite to replace it"
        )
    if recorded >= total:
        return UsageError(
            f"{out} already holds this run, and it is complete ({plural(total, 'sample')} "
            f"recorded): see it with `conductor report {out}`, or pass --overwrite to run "
            "it again from nothing"
        )
    return UsageError(
        f"{out} already holds this run, {recorded} of {plural(total, 'sample')} recorded: "
        f"pass --resume {out} to continue it, or --overwrite to start it again from nothing"
    )


def check_overwritable(out: Path) -> None:
    """Refuse ``--overwrite`` of ``out`` unless what it would delete is a bench run's:
    the files bench writes, where ``config.json`` says a bench run wrote them (a
    directory of something else that happens to hold a ``samples.jsonl``, such as
    ``serve --records``, is refused with nothing deleted, and before it is locked)."""
    if not any((out / name).exists() for name in RUN_FILES):
        return
    try:
        read_run_config(out)
    except UsageError:
        raise UsageError(
            f"--overwrite: {out} does not look like a bench run directory (it has no "
            f"readable {CONFIG} of a bench run), so nothing was deleted; choose another --out"
        ) from None


def clear_for_overwrite(out: Path) -> None:
    """Delete the run in ``out`` for ``--overwrite`` (checked by
    :func:`check_overwritable`; the caller holds the directory's lock)."""
    check_overwritable(out)  # again, under the lock: another process may have written
    try:
        clear_run(out)
    except OSError as exc:
        raise UsageError(
            f"--overwrite: cannot delete the run in {out} ({exc.strerror or exc}); delete "
            "it yourself or choose another --out"
        ) from None


def check_claim(
    spec: BenchmarkSpec, options: BenchOptions, config: BenchConfig, epochs: int
) -> int:
    """What :func:`claim_run_dir` refuses, read only: records of another run in
    ``options.out_dir``, this run's without ``--resume``, or, resuming, a run that
    differs (with ``--overwrite`` whatever is there goes, so nothing is refused).
    Returns how many (sample, epoch) pairs the run has in all."""
    out = options.out_dir
    total = _total_pairs(spec, options, epochs, config)
    if not options.overwrite and (out / CONFIG).exists() and holds_records(out):
        old = read_run_config(out)
        if not options.resume:
            raise _occupied(out, run_difference(old, config), _recorded_pairs(out), total)
        check_same_run(old, config, out)
    return total


def check_join(spec: BenchmarkSpec, options: BenchOptions, config: BenchConfig, epochs: int) -> int:
    """Refuse to join the processes running ``options.out_dir`` (``--state``) unless
    they run the same run as ``config``, or to ``--overwrite`` what they write.
    Returns how many (sample, epoch) pairs the run has in all."""
    out = options.out_dir
    if options.overwrite:
        raise UsageError(
            f"--overwrite: {out} is being run by other conductor processes (--state); "
            "stop them first, or leave out --overwrite to join them"
        )
    difference = run_difference(read_run_config(out), config)
    if difference is not None:
        raise UsageError(
            f"{out}: cannot join the processes running it: {difference}; give the "
            "command line they were started with, or choose another --out"
        )
    return _total_pairs(spec, options, epochs, config)


def claim_run_dir(
    spec: BenchmarkSpec, options: BenchOptions, config: BenchConfig, epochs: int
) -> int:
    """Make ``options.out_dir`` (locked by the caller) the run ``config``'s: clear it for
    ``--overwrite``, refuse another run's records (or, resuming, a run that differs),
    else write ``config.json``.  Returns how many (sample, epoch) pairs the run has in
    all."""
    out = options.out_dir
    config_path = out / CONFIG
    if options.overwrite:
        clear_for_overwrite(out)
    total = check_claim(spec, options, config, epochs)
    if config_path.exists() and holds_records(out):
        return total
    try:
        write_private(config_path, config.to_json(), atomic=False)
    except OSError as exc:
        with suppress(OSError):
            config_path.unlink()
        raise io_stop(exc, config_path, out, 0) from None
    return total


# -- the work -------------------------------------------------------------------------


def _shard_samples(spec: BenchmarkSpec, options: BenchOptions) -> Iterator[Sample]:
    """This shard's samples (every one, run or excluded), streamed in dataset order."""
    shard_i, shard_n = options.shard or (0, 1)
    samples = iter_samples(
        spec, data_file=options.data_file, seed=options.seed, limit=options.limit
    )
    for position, sample in enumerate(samples):
        if position % shard_n == shard_i:
            yield sample


def trained_count(spec: BenchmarkSpec, options: BenchOptions) -> int | None:
    """How many of this shard's samples the Conductor was trained on (one pass over the
    data), or None when its training questions are not known."""
    trained = options.trained_on
    if trained is None:
        return None
    return sum(1 for sample in _shard_samples(spec, options) if trained.contains(sample))


def remaining_work(
    spec: BenchmarkSpec, options: BenchOptions, epochs: int, done: set[tuple[str, int]]
) -> Iterator[tuple[Sample, int]]:
    """(sample, epoch) pairs still to run, streamed in dataset order."""
    trained = options.trained_on if options.exclude_trained else None
    for sample in _shard_samples(spec, options):
        if trained is not None and trained.contains(sample):
            continue
        for epoch in range(epochs):
            if (sample.id, epoch) not in done:
                yield sample, epoch
