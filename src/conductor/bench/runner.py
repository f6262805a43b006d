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
next run (see ``runlock``).  Sharding takes every N-th sample
of the dataset order; ``merge_runs`` joins the shards of one run.

Given the questions a Conductor checkpoint was trained on (``BenchOptions.trained_on``),
``config.json`` records how many of the run's samples are among them (``trained_on``),
and ``exclude_trained`` leaves those samples out of the run altogether.

The parts live beside it: what a run is, its ``config.json`` and whether a resume or a
merge continues it (``runconfig``); holding the directory and undoing an empty run
(``runlock``); why a run stops and how a fault is told, secrets masked (``faults``);
replaying graded samples from the cache (``samplecache``); joining shards (``merge``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..benchmark import BenchmarkSpec
from ..datasets.samples import count_samples, iter_samples, recorded_metadata, render_prompt
from ..errors import AuthenticationError, CacheError, UsageError
from ..grading import Grader
from ..grading.types import Sample, Verdict
from ..llm.cache import ResponseCache
from ..private import open_private, own_dir, write_private
from ..record import RunRecord, now_iso, record_to_dict
from ..runs.lock import _absent, _absent_files, _holds_records, _lock_run_dir, _undo_empty_run
from ..runs.rundir import (
    CONFIG,
    LOCK,
    RUN_FILES,
    SAMPLES,
    SampleLines,
    clear_run,
    repair_tail,
    sample_key,
)
from ..runs.rundir import open_samples as _open_samples
from ..runs.rundir import record_line as _record_line
from ..runs.rundir import write_line as _write_line
from ..strategies import Strategy
from ..text import plural
from .faults import (
    BenchStopped,
    _auth_failure,
    _auth_stop,
    _cache_stop,
    _io_stop,
    _pool_secrets,
    _reason,
    _scrub,
)
from .runconfig import BenchOptions, _check_same_run, _config, read_run_config, run_difference
from .samplecache import _cache_get, _cache_set, _replayed_line, _run_key, _sample_key

__all__ = [
    "BenchProgress",
    "completed_keys",
    "run_benchmark",
]


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

    @property
    def nothing_to_run(self) -> bool:
        """Whether every (sample, epoch) had its record before this invocation began
        (a resume of a complete run)."""
        return self.total > 0 and self.done == 0 and self.skipped >= self.total


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
        with open_private(tmp, "w", encoding="utf-8") as out:
            for _number, data in lines:
                if not _is_error(data):
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
        tmp.replace(path)
    return {sample_key(data) for _number, data in lines}


def _recorded_pairs(out_dir: Path) -> int:
    """How many (sample, epoch) pairs ``out_dir`` holds a record of (read only)."""
    return len({sample_key(data) for _number, data in SampleLines(out_dir / SAMPLES)})


def _total_pairs(
    spec: BenchmarkSpec, options: BenchOptions, epochs: int, config: dict[str, Any]
) -> int:
    """How many (sample, epoch) pairs this shard of the run has in all."""
    # Rows are counted, not decoded, so the count costs little.
    n = count_samples(spec, data_file=options.data_file, limit=options.limit)
    shard_i, shard_n = options.shard or (0, 1)
    total = len(range(shard_i, n, shard_n)) * epochs
    if options.exclude_trained:
        total -= (config["trained_on"]["samples"] or 0) * epochs
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


def _check_overwritable(out: Path) -> None:
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


def _clear_for_overwrite(out: Path) -> None:
    """Delete the run in ``out`` for ``--overwrite`` (checked by
    :func:`_check_overwritable`; the caller holds the directory's lock)."""
    _check_overwritable(out)  # again, under the lock: another process may have written
    try:
        clear_run(out)
    except OSError as exc:
        raise UsageError(
            f"--overwrite: cannot delete the run in {out} ({exc.strerror or exc}); delete "
            "it yourself or choose another --out"
        ) from None


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
    if options.overwrite:
        _check_overwritable(out)
    created = _absent(out)
    try:
        own_dir(out, "the run directory", (*RUN_FILES, LOCK))
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
    if options.overwrite:
        _clear_for_overwrite(out)
    total = _total_pairs(spec, options, epochs, config)
    if config_path.exists() and _holds_records(out):
        old = read_run_config(out)
        if not options.resume:
            raise _occupied(out, run_difference(old, config), _recorded_pairs(out), total)
        _check_same_run(old, config, out)
    else:
        try:
            write_private(
                config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n", atomic=False
            )
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

    def sample_metadata(sample: Sample) -> dict[str, Any]:
        """What every record of this run says beside its prompt: the benchmark, the
        strategy and the sample's own question.  ``record.question`` is the prompt, the
        benchmark's template filled in; a reader (``conductor view``'s sample list) wants
        the question without the template's instructions around it."""
        meta: dict[str, Any] = {"benchmark": spec.name, "strategy": strategy.name}
        question = sample.input.get("question")
        if isinstance(question, str):
            meta["question"] = question
        return meta

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
            metadata=sample_metadata(sample),
        )
        return _record_line(record_to_dict(record))

    async def graded_line(
        record: RunRecord, sample: Sample, key: str | None
    ) -> tuple[str, str, float]:
        record.gold = sample.gold
        # Without the hidden tests: the next program graded on this machine could read them.
        record.metadata.update(
            sample_metadata(sample), sample=recorded_metadata(spec, sample, options.data_file)
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
            except CacheError as exc:
                halt(_cache_stop(exc, out, progress.done), cancel=True)
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
                except CacheError as exc:
                    halt(_cache_stop(exc, out, progress.done), cancel=True)
                    return
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
        progress.total = total
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
