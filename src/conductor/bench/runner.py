"""Running a benchmark: samples -> strategy -> grader -> ``samples.jsonl``.

The run directory holds ``config.json`` (what was run), ``samples.jsonl`` (one run
record per sample and epoch, appended and flushed as each finishes, so a killed run
loses nothing already finished) and ``summary.json``.  Samples are streamed from the
dataset and records are written, not kept, so memory stays flat however long the run.

Every (sample, epoch) that starts ends as exactly one record: an answer, or a failed
run (``run_failed``) or ``grader_error`` record carrying the reason, whatever the
strategy or the grader raised.  Two faults stop the whole run at once instead, since
every later sample would share them and each would still be paid for: the run
directory cannot be written (a full disk), or a provider refuses the credentials.
:class:`BenchStopped` then says what happened and how to resume.

Resuming reads which (sample, epoch) pairs are already in ``samples.jsonl`` and skips
them; a torn last line left by a killed process is cut off first.  ``retry_errors``
removes the records of failed runs (and grader errors) before resuming, so they run
again and no pair is ever recorded twice.  A resume must continue the same run: any
difference from ``config.json`` in what decides a sample is refused, naming it.  A lock
on ``.lock`` keeps a second process out of the directory (the OS drops it when the
holder dies, so a killed run leaves nothing stale).  A run that fails before its first
record removes what it created, and a directory without records is taken over by the
next run (see ``_undo_empty_run``).  Sharding takes every N-th sample
of the dataset order; ``merge_runs`` joins the shards of one run.

Given the questions a Conductor checkpoint was trained on (``BenchOptions.trained_on``),
``config.json`` records how many of the run's samples are among them (``trained_on``),
and ``exclude_trained`` leaves those samples out of the run altogether.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .. import __version__, errors
from ..cache import ResponseCache
from ..errors import AuthenticationError, ConductorError, UsageError
from ..record import RunRecord, new_run_id, now_iso, record_to_dict
from ..text import plural
from .data import count_samples, dataset_provenance, iter_samples, render_prompt
from .graders import Grader
from .rundir import CONFIG, LOCK, SAMPLES, SampleLines, repair_tail, sample_key
from .strategies import Strategy
from .types import BenchmarkSpec, Sample, Verdict

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from ..train.contamination import TrainedQuestions

__all__ = [
    "BenchOptions",
    "BenchProgress",
    "BenchStopped",
    "RunDirBusyError",
    "completed_keys",
    "merge_runs",
    "read_run_config",
    "run_benchmark",
    "stored_invocation",
]

log = logging.getLogger(__name__)

#: 2 added ``invocation`` (what rebuilds the run for ``--resume DIR`` alone) and the
#: pool file's SHA-256; schema 1 directories are still read and resumed.
CONFIG_SCHEMA = 2
#: The longest reason kept from an unexpected exception.
MAX_REASON_CHARS = 500


class BenchStopped(ConductorError):
    """The run stopped early for a reason every remaining sample would share; the
    records already written are kept and the message says how to resume."""


class RunDirBusyError(UsageError):
    """Another process holds the run directory."""


@dataclass(frozen=True)
class BenchOptions:
    """How to run: which data, how much, how fast, where to write."""

    out_dir: Path
    data_file: Path | None = None
    limit: int | None = None
    epochs: int | None = None
    seed: int = 0
    concurrency: int = 16
    grader_concurrency: int = max(1, (os.cpu_count() or 2))
    resume: bool = False
    retry_errors: bool = False
    shard: tuple[int, int] | None = None
    #: What rebuilds this run from its directory alone (benchmark, pool path, strategy,
    #: Conductor, budgets...): the CLI's options, kept in ``config.json``.
    invocation: Mapping[str, Any] | None = None
    #: The SHA-256 of the pool file's text, kept in ``config.json``.
    pool_sha256: str | None = None
    #: The questions the Conductor checkpoint was trained on: how many of this run's
    #: samples are among them goes into ``config.json`` (``trained_on``) ...
    trained_on: TrainedQuestions | None = None
    #: ... and with this set, those samples are not run at all.
    exclude_trained: bool = False


@dataclass
class BenchProgress:
    """Running totals, updated as each sample finishes (for progress displays)."""

    total: int = 0
    skipped: int = 0
    done: int = 0
    correct: int = 0
    errors: int = 0
    cost_usd: float = 0.0
    verdicts: dict[str, int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float | None:
        return 100.0 * self.correct / self.done if self.done else None


# -- the samples file ----------------------------------------------------------------


def _is_error(data: dict[str, Any]) -> bool:
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
        with tmp.open("w", encoding="utf-8") as out:
            for _number, data in lines:
                if not _is_error(data):
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
        tmp.replace(path)
    return {sample_key(data) for _number, data in lines}


# -- config ---------------------------------------------------------------------------


def _config(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    epochs: int,
    trained: int | None = None,
) -> dict[str, Any]:
    trained_on = options.trained_on
    return {
        "schema_version": CONFIG_SCHEMA,
        "benchmark": {
            "name": spec.name,
            "paper_key": spec.paper_key,
            "grader": grader.name,
            "grader_version": grader.version,
            "grader_options": spec.grader_options,
            "provenance": dataset_provenance(spec, options.data_file),
        },
        "strategy": strategy.name,
        "strategy_detail": strategy.describe(),
        "pool": pool_dict,
        "settings": {"concurrency": options.concurrency},
        "epochs": epochs,
        "seed": options.seed,
        "limit": options.limit,
        "shard": list(options.shard) if options.shard else None,
        "pool_sha256": options.pool_sha256,
        "invocation": dict(options.invocation) if options.invocation is not None else None,
        "trained_on": (
            {
                "checkpoint": trained_on.source,
                "questions": len(trained_on.hashes),
                "samples": trained,
            }
            if trained_on is not None
            else None
        ),
        # Null unless set, so that runs from before the option resume as they were.
        "exclude_trained": options.exclude_trained or None,
        "created_at": now_iso(),
        "conductor_version": __version__,
    }


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The ``config.json`` of a bench run directory; one sentence when there is none or
    it cannot be read."""
    path = run_dir / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{run_dir}: no {CONFIG}; not a bench run directory") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{path}: cannot be read as a run config ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmark"), dict):
        raise UsageError(f"{path}: not a bench run config")
    return data


def stored_invocation(config: Mapping[str, Any]) -> dict[str, Any]:
    """The options that rebuild the run ``config`` describes, for ``--resume DIR``.

    Schema 2 keeps them as given.  For a schema 1 config they are read back from what it
    recorded (benchmark file, pool path, strategy, data file, limits, Conductor
    settings); the ``--conductor`` option was not recorded, so the pool's own Conductor
    is assumed, and a run started with another one is refused (naming the difference)
    until ``--conductor`` is given again."""
    kept = config.get("invocation")
    if isinstance(kept, Mapping):
        return dict(kept)
    bench = config.get("benchmark") or {}
    prov = bench.get("provenance") or {}
    detail = config.get("strategy_detail") or {}
    found = detail.get("settings")
    settings: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    shard = config.get("shard")
    return {
        "benchmark": prov.get("benchmark_file") or bench.get("name"),
        "pool": (config.get("pool") or {}).get("path"),
        "conductor": None,
        "strategy": config.get("strategy"),
        "data": prov.get("file") if prov.get("source_kind") == "file" else None,
        "limit": config.get("limit"),
        "epochs": config.get("epochs"),
        "seed": config.get("seed", 0),
        "shard": f"{shard[0]}/{shard[1]}" if isinstance(shard, list) and len(shard) == 2 else None,
        "max_steps": settings.get("max_steps"),
        "rounds": settings.get("rounds"),
        "budget_usd": settings.get("budget_usd"),
        "max_calls": settings.get("max_calls"),
        "concurrency": (config.get("settings") or {}).get("concurrency"),
    }


# What must match for a resume (or a merge) to continue the same run, with the name a
# refusal uses.  Paths are not compared (a moved pool or data file with the same
# contents is the same run); contents and hashes are.
_SAME_RUN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("benchmark", ("benchmark", "name")),
    ("grader", ("benchmark", "grader")),
    ("grader version", ("benchmark", "grader_version")),
    ("grader options", ("benchmark", "grader_options")),
    ("prompt template", ("benchmark", "provenance", "template_sha256")),
    ("data file contents (SHA-256)", ("benchmark", "provenance", "file_sha256")),
    ("dataset revision", ("benchmark", "provenance", "revision")),
    ("dataset filters", ("benchmark", "provenance", "filters")),
    ("strategy", ("strategy",)),
    ("epochs", ("epochs",)),
    ("seed", ("seed",)),
    ("limit", ("limit",)),
    ("--exclude-trained setting", ("exclude_trained",)),
)
# Compared field by field, so a refusal names e.g. ``settings.max_steps``.
_SAME_RUN_TREES = (("strategy settings", "strategy_detail"), ("pool", "pool"))
# How a model is reached, paced and paid for does not decide its answers: a resume may
# change these (a moved pool file, a longer time-out, a new price or key variable).
_RUNTIME_KEYS = frozenset(
    {
        "path",
        "api_key_env",
        "max_concurrency",
        "timeout_s",
        "total_timeout_s",
        "max_retries",
        "price",
        "n_threads",
        "n_gpu_layers",
    }
)


# Descriptions derived from fields compared anyway (the Conductor's ``sampling`` is in its
# target's params, ``template_form`` follows the template's hash): skipping them keeps
# runs recorded before they existed resumable.
_DERIVED_KEYS = frozenset({"sampling", "template_form"})
_UNCOMPARED_KEYS = _RUNTIME_KEYS | _DERIVED_KEYS


def _get(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """Where two JSON values first differ (``workers[1].temperature: 0.2 -> 0.7``)."""
    stack: list[tuple[Any, Any, str]] = [(old, new, where)]
    while stack:
        a, b, at = stack.pop()
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys = [k for k in {**a, **b} if k not in _UNCOMPARED_KEYS]
            stack.extend(
                (a.get(k), b.get(k), f"{at}.{k}" if at else str(k)) for k in reversed(keys)
            )
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            stack.extend((a[i], b[i], f"{at}[{i}]") for i in range(len(a) - 1, -1, -1))
        elif a != b:
            return f"{at or 'value'} was {_short(a)}, now {_short(b)}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_same_run(
    old: dict[str, Any], new: dict[str, Any], where: Path, *, shards: bool = False
) -> None:
    """Refuse, naming the first difference, unless ``new`` continues the run ``old``.

    ``shards`` compares the shards of one run, which differ in ``shard`` (and may reach
    their models at other addresses)."""
    for name, path in _SAME_RUN:
        if path[-1] == "file_sha256" and _get(old, path) is None:
            continue  # a downloaded file not yet fetched when the run started
        if _get(old, path) != _get(new, path):
            raise UsageError(
                f"{where}: cannot {'merge' if shards else 'resume'}: the {name} was "
                f"{_short(_get(old, path))}, now {_short(_get(new, path))}; "
                + ("merge only shards of one run" if shards else "run it in a new --out directory")
            )
    if not shards and old.get("shard") != new.get("shard"):
        raise UsageError(
            f"{where}: cannot resume: --shard was {old.get('shard')}, now {new.get('shard')}"
        )
    for name, key in () if shards else _SAME_RUN_TREES:
        # Shards may reach the same models at other addresses, so merging compares
        # only the fields above.
        if key not in old:
            continue  # not recorded by the run that wrote the config
        diff = _first_difference(old.get(key), new.get(key))
        if diff is not None:
            raise UsageError(
                f"{where}: cannot resume: the {name} changed "
                f"({diff}); run it in a new --out directory"
            )


# -- running --------------------------------------------------------------------------


def _shard_samples(spec: BenchmarkSpec, options: BenchOptions) -> Iterator[Sample]:
    """This shard's samples (every one, run or excluded), streamed in dataset order."""
    shard_i, shard_n = options.shard or (0, 1)
    samples = iter_samples(
        spec, data_file=options.data_file, seed=options.seed, limit=options.limit
    )
    for position, sample in enumerate(samples):
        if position % shard_n == shard_i:
            yield sample


def _trained_count(spec: BenchmarkSpec, options: BenchOptions) -> int | None:
    """How many of this shard's samples the Conductor was trained on (one pass over the
    data), or None when its training questions are not known."""
    trained = options.trained_on
    if trained is None:
        return None
    return sum(1 for sample in _shard_samples(spec, options) if trained.contains(sample))


def _work(
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


async def run_benchmark(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    *,
    cache: ResponseCache | None = None,
    on_progress: Callable[[BenchProgress], None] | None = None,
) -> BenchProgress:
    """Run every remaining (sample, epoch) of ``spec`` and append its record.

    With ``cache``, each graded sample is also kept under a key that covers everything
    that decides it (benchmark, prompt, grader, strategy, pool, Conductor settings and
    template, seed, epoch, conductor version), so an identical rerun replays it without
    re-running the workflow.  A replayed record is the original one with a new run id
    and ``replayed_from`` (the original run id and the time of the replay).  Failed runs
    and grader errors are never kept.

    A sample holds one of ``concurrency`` slots while its model calls run and gives it
    up before it is graded; grading runs on its own ``grader_concurrency`` threads.

    Raises :class:`RunDirBusyError` when another process holds ``out_dir``, and
    :class:`BenchStopped` when the directory cannot be written or a provider refuses
    the credentials (no further sample is started; records written are kept).
    Cancelling (Ctrl-C) stops new work, abandons what is in flight and keeps everything
    already written.  Returns the running totals of this invocation.
    """
    out = options.out_dir
    epochs = options.epochs or spec.epochs
    if options.exclude_trained and options.trained_on is None:
        raise UsageError(
            "--exclude-trained needs a Conductor checkpoint that records the questions "
            "it was trained on (conductor train writes them); this Conductor records none"
        )
    trained = _trained_count(spec, options)
    config = _config(spec, strategy, grader, pool_dict, options, epochs, trained)
    created = _absent(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out}: cannot create the run directory ({exc.strerror})") from None
    new_files = _absent_files(out)
    # Only a holder of the lock may undo anything: a busy directory is another run's.
    lock = _lock_run_dir(out)
    try:
        return await _run_locked(
            spec, strategy, grader, pool_dict, options, config, epochs, cache, on_progress
        )
    except BenchStopped:
        raise  # its message says how to resume from this directory: it stays
    except Exception:
        _undo_empty_run(out, created, new_files)
        raise
    finally:
        lock.close()


# A run that fails before its first record (a bad data file, a dataset out of reach, a
# Conductor that cannot load) must not leave a directory that refuses the same command
# once the input is fixed.  Two rules cover it: the failed invocation removes what it
# created (its files, then its directories if they are empty: rmdir never removes a
# directory holding anything else), and a directory without records is taken over by
# the next run (what a killed process, or a folder the user made, leaves behind).
# A directory with a record in samples.jsonl is never removed nor taken over.


def _absent(out: Path) -> list[Path]:
    """``out`` and those of its parents that do not exist yet, deepest first."""
    missing: list[Path] = []
    path = out.absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _absent_files(out: Path) -> list[Path]:
    """The run files this invocation would create in ``out`` (those not there yet)."""
    return [out / name for name in (CONFIG, SAMPLES, LOCK) if not (out / name).exists()]


def _holds_records(out: Path) -> bool:
    """Whether ``out`` has anything in ``samples.jsonl`` (even a torn first line)."""
    path = out / SAMPLES
    return path.is_file() and path.stat().st_size > 0


def _undo_empty_run(out: Path, created_dirs: list[Path], new_files: list[Path]) -> None:
    """Remove the files and directories this invocation created, if no record was
    written; anything else in the directory keeps it (and the directory) in place."""
    if _holds_records(out):
        return
    for path in new_files:
        with suppress(OSError):
            path.unlink()
    for folder in created_dirs:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (or not ours to remove): neither are its parents


def _lock_run_dir(out: Path) -> IO[str]:
    """Hold ``out/.lock`` for this process; the OS releases it when the process ends,
    however it ends, so a killed run never leaves a stale lock."""
    path = out / LOCK
    try:
        fh = path.open("a+", encoding="utf-8")
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


def _open_samples(path: Path) -> IO[bytes]:
    """The samples file, opened unbuffered for appending: a failed write leaves nothing
    in a buffer to be written later by someone else."""
    return path.open("ab", buffering=0)


def _write_line(fh: IO[bytes], line: str) -> None:
    data = line.encode("utf-8")
    while data:
        written = fh.write(data)
        if not written:
            raise OSError(errno.EIO, "short write")
        data = data[written:]


def _record_line(data: dict[str, Any]) -> str:
    """One JSON line for ``data``.  Text that is not valid Unicode (a lone surrogate read
    from the data) is written as ``\\u`` escapes, so it neither fails the write nor is
    altered on reading back."""
    line = json.dumps(data, ensure_ascii=False, default=str)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(data, ensure_ascii=True, default=str)
    return line + "\n"


def _reason(exc: BaseException, secrets: list[str]) -> str:
    """An exception as one clipped line (its type and message), with secrets masked."""
    return _scrub(f"{type(exc).__name__}: {exc}", secrets)


def _scrub(text: str, secrets: list[str]) -> str:
    text = text.replace("\n", " ")
    for secret in secrets:
        text = text.replace(secret, "***")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _pool_secrets(pool_dict: Mapping[str, Any]) -> list[str]:
    """The values of the key variables the pool names, to mask in reasons."""
    entries = [*(pool_dict.get("workers") or []), pool_dict.get("conductor") or {}]
    names = {e.get("api_key_env") for e in entries if isinstance(e, Mapping)}
    return [v for n in names if isinstance(n, str) and len(v := os.environ.get(n, "")) >= 4]


def _auth_failure(record: RunRecord) -> str | None:
    """The first call of ``record`` refused for its credentials or permissions."""
    for call in record.all_calls():
        cls = getattr(errors, call.error_kind or "", None)
        if isinstance(cls, type) and issubclass(cls, AuthenticationError):
            return call.error or "authentication failed"
    return None


def _io_stop(exc: OSError, path: Path, out: Path, written: int) -> BenchStopped:
    what = errno.errorcode.get(exc.errno or 0, "I/O error")
    return BenchStopped(
        f"cannot write {path} ({exc.strerror or exc}, {what}): stopped before starting "
        f"more samples; the {plural(written, 'record')} written this time are kept, so free space "
        f"or fix the directory, then continue with `conductor bench --resume {out}`"
    )


def _auth_stop(message: str, out: Path, written: int) -> BenchStopped:
    return BenchStopped(
        f"stopped: {message}; no more samples were started and the "
        f"{plural(written, 'record')} written this time are kept, so fix the key or its "
        f"permissions, then continue with `conductor bench --resume {out}`"
    )


def _cache_get(cache: ResponseCache | None, key: str | None) -> Any:
    if cache is None or key is None:
        return None
    try:
        return cache.get_value(key)
    except Exception as exc:  # noqa: BLE001 - a cache fault costs a replay, never a sample
        log.warning("the sample cache could not be read (%s); running the sample", exc)
        return None


def _cache_set(cache: ResponseCache | None, key: str, value: dict[str, Any]) -> None:
    if cache is None:
        return
    try:
        cache.set_value(key, value)
    except Exception as exc:  # noqa: BLE001 - the record is written either way
        log.warning("the sample cache could not be written (%s)", exc)


@dataclass
class _Stop:
    """The first fault that ends the run; set once, read by the dispatcher."""

    error: BenchStopped | None = None


async def _run_locked(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    config: dict[str, Any],
    epochs: int,
    cache: ResponseCache | None,
    on_progress: Callable[[BenchProgress], None] | None,
) -> BenchProgress:
    out = options.out_dir
    config_path = out / CONFIG
    if config_path.exists() and _holds_records(out):
        if not options.resume:
            raise UsageError(
                f"{out} already holds a run; pass --resume {out} to continue it, or choose "
                "another --out"
            )
        _check_same_run(read_run_config(out), config, out)
    else:
        try:
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        except OSError as exc:
            with suppress(OSError):
                config_path.unlink()
            raise _io_stop(exc, config_path, out, 0) from None
    done = completed_keys(out, drop_errors=options.retry_errors)

    progress = BenchProgress(skipped=len(done))
    notify = on_progress or (lambda _p: None)
    slots = asyncio.Semaphore(max(1, options.concurrency))
    graders = max(1, options.grader_concurrency)
    # A sample being graded holds no slot; this bounds how many are in flight in all,
    # so requests slow down only when every grader thread is busy and one more waits.
    pending = asyncio.Semaphore(max(1, options.concurrency) + graders)
    grade_pool = ThreadPoolExecutor(max_workers=graders, thread_name_prefix="conductor-grade")
    loop = asyncio.get_running_loop()
    samples_path = out / SAMPLES
    fh = _open_samples(samples_path)
    stop = _Stop()
    secrets = _pool_secrets(pool_dict)
    tasks: set[asyncio.Task[None]] = set()
    run_key = _run_key(config)

    def halt(error: BenchStopped, *, cancel: bool) -> None:
        """Start no more samples; with ``cancel`` also abandon those in flight."""
        if stop.error is None:
            stop.error = error
        if cancel:
            for task in list(tasks):
                if task is not asyncio.current_task():
                    task.cancel()

    def failed_line(question: str, sample: Sample, epoch: int, exc: BaseException) -> str:
        record = RunRecord(
            question=question,
            pool=pool_dict,
            conductor={"backend": "strategy", "strategy": strategy.name},
            settings={"sample_index": epoch, "strategy": strategy.name},
            sample_id=sample.id,
            epoch=epoch,
            status="failed",
            error=f"the run raised {_reason(exc, secrets)}",
            finished_at=now_iso(),
            gold=sample.gold,
            metadata={"benchmark": spec.name, "strategy": strategy.name},
        )
        return _record_line(record_to_dict(record))

    async def graded_line(
        record: RunRecord, sample: Sample, key: str | None
    ) -> tuple[str, str, float]:
        record.gold = sample.gold
        record.metadata.update(
            {"benchmark": spec.name, "strategy": strategy.name, "sample": sample.metadata}
        )
        if record.status != "failed":
            try:
                verdict = await loop.run_in_executor(
                    grade_pool, grader.grade, record.final_answer, sample
                )
            except Exception as exc:  # noqa: BLE001 - a grader fault is this sample's verdict
                verdict = Verdict("grader_error", f"the grader raised {_reason(exc, secrets)}")
            record.grade = verdict.to_dict()
        data = record_to_dict(record)
        line = _record_line(data)
        status = str((record.grade or {}).get("status", "run_failed"))
        cost = record.totals.cost_usd or 0.0
        # An answer built on a cut-off reply is not kept either: a rerun should ask again,
        # as the call cache does for the truncated call itself.
        truncated = any(call.truncated for call in record.all_calls())
        if key is not None and not truncated and not _is_error(data):
            _cache_set(
                cache, key, {"line": line, "run_id": record.run_id, "status": status, "cost": cost}
            )
        return line, status, cost

    # Tasks created but not yet started.  A task cancelled before its first step never
    # runs its body, so its ``finally`` cannot hand back the slot and the in-flight place
    # the dispatcher took for it: ``collect`` does, or the dispatcher would wait forever.
    unstarted: set[asyncio.Task[None]] = set()

    async def one(sample: Sample, epoch: int) -> None:
        me = asyncio.current_task()
        if me is not None:
            unstarted.discard(me)
        holding = True

        def free_slot() -> None:
            nonlocal holding
            if holding:
                holding = False
                slots.release()

        try:
            question, key = "", None
            record: RunRecord | None = None
            result: tuple[str, str, float] | None = None
            try:
                question = render_prompt(spec, sample)
                key = _sample_key(run_key, sample, question, epoch) if cache is not None else None
                kept = _cache_get(cache, key)
                if isinstance(kept, dict) and isinstance(kept.get("line"), str):
                    result = (_replayed_line(kept), str(kept["status"]), float(kept["cost"]))
                else:
                    record = await strategy.run(
                        question, sample_index=epoch, sample_id=sample.id, epoch=epoch
                    )
            except AuthenticationError as exc:
                halt(_auth_stop(_scrub(exc.describe(), secrets), out, progress.done), cancel=False)
                return
            except Exception as exc:  # noqa: BLE001 - any fault of one sample is its record
                result = (failed_line(question, sample, epoch, exc), "run_failed", 0.0)
            # The model calls are over: the next sample may start while this one is graded.
            free_slot()
            if result is None:
                assert record is not None
                auth = _auth_failure(record)
                if auth is not None:
                    # Not written: the sample runs again on resume, once the key works.
                    halt(
                        _auth_stop(_scrub(auth, secrets), out, progress.done),
                        cancel=False,
                    )
                    return
                try:
                    result = await graded_line(record, sample, key)
                except Exception as exc:  # noqa: BLE001 - e.g. a record that cannot be encoded
                    result = (failed_line(question, sample, epoch, exc), "run_failed", 0.0)
            line, status, cost = result
            try:
                _write_line(fh, line)
            except OSError as exc:
                halt(_io_stop(exc, samples_path, out, progress.done), cancel=True)
                return
            progress.done += 1
            progress.verdicts[status] = progress.verdicts.get(status, 0) + 1
            progress.correct += int(status == "correct")
            progress.errors += int(status in ("run_failed", "grader_error"))
            progress.cost_usd += cost
            notify(progress)
        finally:
            free_slot()
            pending.release()

    def collect(task: asyncio.Task[None]) -> None:
        # Every task's outcome is read here, so no exception can go unnoticed.
        tasks.discard(task)
        if task in unstarted:
            unstarted.discard(task)
            slots.release()
            pending.release()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            halt(
                BenchStopped(
                    f"stopped by an unexpected error ({_reason(exc, secrets)}); the records "
                    f"written are kept in {out}; continue with `conductor bench --resume {out}`"
                ),
                cancel=True,
            )

    try:
        # Rows are counted, not decoded, so the count costs little.
        n = count_samples(spec, data_file=options.data_file, limit=options.limit)
        shard_i, shard_n = options.shard or (0, 1)
        progress.total = len(range(shard_i, n, shard_n)) * epochs
        if options.exclude_trained:
            progress.total -= (config["trained_on"]["samples"] or 0) * epochs
        notify(progress)
        for sample, epoch in _work(spec, options, epochs, done):
            await pending.acquire()
            await slots.acquire()
            if stop.error is not None:
                slots.release()
                pending.release()
                break
            task = asyncio.create_task(one(sample, epoch))
            tasks.add(task)
            unstarted.add(task)
            task.add_done_callback(collect)
        while tasks:
            await asyncio.wait(list(tasks))
    except Exception:
        # The data failed part-way: the samples in flight finish and are kept.
        while tasks:
            await asyncio.wait(list(tasks))
        raise
    except BaseException:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*list(tasks), return_exceptions=True)
        raise
    finally:
        with suppress(OSError):
            fh.close()
        grade_pool.shutdown(wait=False, cancel_futures=True)
        await strategy.aclose()
    if stop.error is not None:
        raise stop.error
    return progress


def _run_key(config: dict[str, Any]) -> str:
    bench = config["benchmark"]
    identity = {
        "v": 1,
        "conductor_version": config["conductor_version"],
        "benchmark": [bench["name"], bench["grader"], bench["grader_version"]],
        "grader_options": bench.get("grader_options"),
        "template_sha256": bench["provenance"].get("template_sha256"),
        "strategy": config["strategy_detail"],
        "pool": config["pool"],
        "seed": config["seed"],
    }
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _sample_key(run_key: str, sample: Sample, question: str, epoch: int) -> str:
    blob = json.dumps([run_key, sample.id, epoch, question, sample.gold], default=str)
    return "sample:" + hashlib.sha256(blob.encode()).hexdigest()


def _replayed_line(kept: dict[str, Any]) -> str:
    """A kept sample's line for this run: a new run id and a ``replayed_from`` note.

    The rest is the original record as it was written (its latencies, costs and cached
    flags describe the execution that produced it), so replaying costs no parsing.
    """
    old_id, new_id = kept["run_id"], new_run_id()
    line: str = kept["line"].replace(f'"run_id": "{old_id}"', f'"run_id": "{new_id}"', 1)
    note = json.dumps({"run_id": old_id, "at": now_iso()})
    # ``replayed_from`` is the record's last field, written as null the first time.
    head, sep, tail = line.rpartition('"replayed_from": null')
    if not sep:
        return line
    return f'{head}"replayed_from": {note}{tail}'


# -- merging shards -------------------------------------------------------------------


def merge_runs(run_dirs: list[Path], out_dir: Path) -> int:
    """Join the shards of one run into ``out_dir``; returns the number of records.

    The shards must agree on benchmark, strategy, epochs and seed; a (sample, epoch)
    pair found in several shards is kept once (the last one read).
    """
    if not run_dirs:
        raise UsageError("bench merge needs at least one run directory")
    configs = []
    for d in run_dirs:
        path = d / CONFIG
        if not path.is_file():
            raise UsageError(f"{d}: no {CONFIG}; not a bench run directory")
        configs.append(json.loads(path.read_text()))
    first = configs[0]
    for d, cfg in zip(run_dirs[1:], configs[1:], strict=True):
        _check_same_run(first, cfg, d, shards=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / SAMPLES).exists():
        raise UsageError(f"{out_dir} already holds samples; merge into an empty directory")
    # Two passes keep memory to the keys: find each pair's last source, then copy.
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for di, d in enumerate(run_dirs):
        for li, data in SampleLines(d / SAMPLES):
            last[sample_key(data)] = (di, li)
    written = 0
    with (out_dir / SAMPLES).open("w", encoding="utf-8") as out:
        for di, d in enumerate(run_dirs):
            for li, data in SampleLines(d / SAMPLES):
                if last.get(sample_key(data)) == (di, li):
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
                    written += 1
    merged = {**first, "shard": None, "merged_from": [str(d) for d in run_dirs]}
    counts = [(cfg.get("trained_on") or {}).get("samples") for cfg in configs]
    if all(isinstance(c, int) for c in counts):
        merged["trained_on"] = {**first["trained_on"], "samples": sum(counts)}
    merged["created_at"] = now_iso()
    (out_dir / CONFIG).write_text(json.dumps(merged, indent=2, ensure_ascii=False) + "\n")
    return written
