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
from typing import IO, Any

from ..benchmark import BenchmarkSpec
from ..datasets.samples import count_samples, iter_samples, recorded_metadata, render_prompt
from ..errors import AuthenticationError, CacheError, UsageError
from ..grading import Grader
from ..grading.types import Sample, Verdict
from ..llm.cache import ResponseCache
from ..private import open_private, own_dir, write_private
from ..record import RunRecord, now_iso, record_to_dict
from ..runs.config import BenchConfig, read_run_config
from ..runs.lock import absent_dirs, absent_files, holds_records, lock_run_dir, undo_empty_run
from ..runs.rundir import (
    CONFIG,
    LOCK,
    RUN_FILES,
    SAMPLES,
    SampleLines,
    clear_run,
    open_samples,
    record_line,
    repair_tail,
    sample_key,
    write_line,
)
from ..strategies import Strategy
from ..text import plural
from . import samplecache
from .faults import (
    BenchStopped,
    auth_failure,
    auth_stop,
    cache_stop,
    io_stop,
    pool_secrets,
    reason,
    scrub,
)
from .runconfig import BenchOptions, build_config, check_same_run, run_difference

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
    config = build_config(spec, strategy, grader, pool_dict, options, epochs, trained)
    if options.overwrite:
        _check_overwritable(out)
    created = absent_dirs(out)
    try:
        own_dir(out, "the run directory", (*RUN_FILES, LOCK))
    except OSError as exc:
        raise UsageError(f"{out}: cannot create the run directory ({exc.strerror})") from None
    new_files = absent_files(out)
    # Only a holder of the lock may undo anything: a busy directory is another run's.
    lock = lock_run_dir(out)
    try:
        loop = SampleLoop(
            spec, strategy, grader, pool_dict, options, config, epochs, cache, on_progress
        )
        return await loop.run()
    except BenchStopped:
        raise  # its message says how to resume from this directory: it stays
    except Exception:
        undo_empty_run(out, created, new_files)
        raise
    finally:
        lock.close()


#: What a finished sample leaves to write: its line, its status and its cost.
_Result = tuple[str, str, float]


class _Slot:
    """A sample's hold on one of the ``concurrency`` slots, given back once."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self._slots: asyncio.Semaphore | None = slots

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.release()


class SampleLoop:
    """One pass of the runner over a locked run directory, in named steps.

    :meth:`run` claims the directory (:meth:`claim`: overwrite, refuse another run or
    write ``config.json``), plans the work (what is already recorded), then dispatches
    one task per (sample, epoch) (:meth:`dispatch`); each task (:meth:`sample`) replays
    the sample from the cache or runs it (:meth:`ask`), grades it (:meth:`grade`) and
    writes its line (:meth:`write`).  A fault every later sample would share
    (:meth:`halt`) stops new work; :meth:`collect` reads every task's outcome;
    :meth:`finish` closes what the pass opened.
    """

    def __init__(
        self,
        spec: BenchmarkSpec,
        strategy: Strategy,
        grader: Grader,
        pool_dict: dict[str, Any],
        options: BenchOptions,
        config: BenchConfig,
        epochs: int,
        cache: ResponseCache | None,
        on_progress: Callable[[BenchProgress], None] | None,
    ) -> None:
        self.spec, self.strategy, self.grader = spec, strategy, grader
        self.pool_dict, self.options, self.config = pool_dict, options, config
        self.epochs, self.cache = epochs, cache
        self.out = options.out_dir
        self.samples_path = self.out / SAMPLES
        self.progress = BenchProgress()
        self.notify: Callable[[BenchProgress], None] = on_progress or (lambda _p: None)
        self.secrets = pool_secrets(pool_dict)
        self.run_key = samplecache.run_key(config)
        concurrency = max(1, options.concurrency)
        graders = max(1, options.grader_concurrency)
        self.slots = asyncio.Semaphore(concurrency)
        # A sample being graded holds no slot; this bounds how many are in flight in all,
        # so requests slow down only when every grader thread is busy and one more waits.
        self.pending = asyncio.Semaphore(concurrency + graders)
        self.graders = graders
        #: The first fault that ends the run; set once, read by the dispatcher.
        self.stopped: BenchStopped | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        # Tasks created but not yet started.  A task cancelled before its first step
        # never runs its body, so it cannot hand back the slot and the in-flight place
        # the dispatcher took for it: :meth:`collect` does, or the dispatcher would wait
        # forever.
        self.unstarted: set[asyncio.Task[None]] = set()

    # -- the pass ------------------------------------------------------------------

    async def run(self) -> BenchProgress:
        """Claim the directory, run what remains, and return this invocation's totals."""
        total = self.claim()
        done = completed_keys(self.out, drop_errors=self.options.retry_errors)
        self.progress.skipped = len(done)
        grade_pool = ThreadPoolExecutor(
            max_workers=self.graders, thread_name_prefix="conductor-grade"
        )
        fh = open_samples(self.samples_path)
        try:
            self.progress.total = total
            self.notify(self.progress)
            await self.dispatch(done, grade_pool, fh)
        except Exception:
            # The data failed part-way: the samples in flight finish and are kept.
            while self.tasks:
                await asyncio.wait(list(self.tasks))
            raise
        except BaseException:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
            raise
        finally:
            await self.finish(grade_pool, fh)
        if self.stopped is not None:
            raise self.stopped
        return self.progress

    def claim(self) -> int:
        """Make the directory this run's: clear it for ``--overwrite``, refuse another
        run's records (or, resuming, a run that differs), else write ``config.json``.
        Returns how many (sample, epoch) pairs the run has in all."""
        out, options, config = self.out, self.options, self.config
        config_path = out / CONFIG
        if options.overwrite:
            _clear_for_overwrite(out)
        total = _total_pairs(self.spec, options, self.epochs, config)
        if config_path.exists() and holds_records(out):
            old = read_run_config(out)
            if not options.resume:
                raise _occupied(out, run_difference(old, config), _recorded_pairs(out), total)
            check_same_run(old, config, out)
            return total
        try:
            write_private(config_path, config.to_json(), atomic=False)
        except OSError as exc:
            with suppress(OSError):
                config_path.unlink()
            raise io_stop(exc, config_path, out, 0) from None
        return total

    async def dispatch(
        self, done: set[tuple[str, int]], grade_pool: ThreadPoolExecutor, fh: IO[bytes]
    ) -> None:
        """Start one task per (sample, epoch) still to run, as slots free up, until the
        work ends or a fault stops it; then wait for those in flight."""
        work = _work(self.spec, self.options, self.epochs, done)
        for sample, epoch in work:
            await self.pending.acquire()
            await self.slots.acquire()
            if self.stopped is not None:
                self.slots.release()
                self.pending.release()
                break
            task = asyncio.create_task(self.sample(sample, epoch, grade_pool, fh))
            self.tasks.add(task)
            self.unstarted.add(task)
            task.add_done_callback(self.collect)
        while self.tasks:
            await asyncio.wait(list(self.tasks))

    async def finish(self, grade_pool: ThreadPoolExecutor, fh: IO[bytes]) -> None:
        """Close what the pass opened: the samples file, the grader threads (those still
        grading are abandoned) and the strategy's callers."""
        with suppress(OSError):
            fh.close()
        grade_pool.shutdown(wait=False, cancel_futures=True)
        await self.strategy.aclose()

    # -- stopping ------------------------------------------------------------------

    def halt(self, error: BenchStopped, *, cancel: bool) -> None:
        """Start no more samples; with ``cancel`` also abandon those in flight."""
        if self.stopped is None:
            self.stopped = error
        if cancel:
            for task in list(self.tasks):
                if task is not asyncio.current_task():
                    task.cancel()

    def collect(self, task: asyncio.Task[None]) -> None:
        """A task's end: give back what a task cancelled before it started holds, and
        stop the run on an exception no sample step caught (none goes unnoticed)."""
        self.tasks.discard(task)
        if task in self.unstarted:
            self.unstarted.discard(task)
            self.slots.release()
            self.pending.release()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            out = self.out
            self.halt(
                BenchStopped(
                    f"stopped by an unexpected error ({reason(exc, self.secrets)}); the "
                    f"records written are kept in {out}; continue with "
                    f"`conductor bench --resume {out}`"
                ),
                cancel=True,
            )

    def _auth_halt(self, message: str) -> None:
        self.halt(
            auth_stop(scrub(message, self.secrets), self.out, self.progress.done), cancel=False
        )

    def _cache_halt(self, exc: CacheError) -> None:
        self.halt(cache_stop(exc, self.out, self.progress.done), cancel=True)

    # -- one sample ----------------------------------------------------------------

    async def sample(
        self, sample: Sample, epoch: int, grade_pool: ThreadPoolExecutor, fh: IO[bytes]
    ) -> None:
        """Run, grade and write one (sample, epoch); its faults are its record, or stop
        the run (refused credentials, a broken cache, a directory that takes no write)."""
        me = asyncio.current_task()
        if me is not None:
            self.unstarted.discard(me)
        slot = _Slot(self.slots)
        try:
            result = await self._result(sample, epoch, slot, grade_pool)
            if result is not None:
                self.write(fh, result)
        finally:
            slot.release()
            self.pending.release()

    async def _result(
        self, sample: Sample, epoch: int, slot: _Slot, grade_pool: ThreadPoolExecutor
    ) -> _Result | None:
        """The line to write for (``sample``, ``epoch``), or ``None`` when the run was
        halted instead (nothing is written: the sample runs again on resume)."""
        question, key = "", None
        try:
            question = render_prompt(self.spec, sample)
            if self.cache is not None:
                key = samplecache.sample_key(self.run_key, sample, question, epoch)
            replayed = self.replay(key)
            if replayed is not None:
                slot.release()
                return replayed
            record = await self.ask(question, epoch, sample)
        except AuthenticationError as exc:
            self._auth_halt(exc.describe())
            return None
        except CacheError as exc:
            self._cache_halt(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - any fault of one sample is its record
            slot.release()
            return self.failed_line(question, sample, epoch, exc), "run_failed", 0.0
        # The model calls are over: the next sample may start while this one is graded.
        slot.release()
        refused = auth_failure(record)
        if refused is not None:
            # Not written: the sample runs again on resume, once the key works.
            self._auth_halt(refused)
            return None
        try:
            return await self.grade(record, sample, key, grade_pool)
        except CacheError as exc:
            self._cache_halt(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - e.g. a record that cannot be encoded
            return self.failed_line(question, sample, epoch, exc), "run_failed", 0.0

    def replay(self, key: str | None) -> _Result | None:
        """The sample's record kept in the cache under ``key``, as this run's line."""
        kept = samplecache.cache_get(self.cache, key)
        if isinstance(kept, dict) and isinstance(kept.get("line"), str):
            return samplecache.replayed_line(kept), str(kept["status"]), float(kept["cost"])
        return None

    async def ask(self, question: str, epoch: int, sample: Sample) -> RunRecord:
        """Run the strategy on the sample's prompt."""
        return await self.strategy.run(
            question, sample_index=epoch, sample_id=sample.id, epoch=epoch
        )

    async def grade(
        self,
        record: RunRecord,
        sample: Sample,
        key: str | None,
        grade_pool: ThreadPoolExecutor,
    ) -> _Result:
        """Grade ``record`` on the grader threads, and keep it in the cache under ``key``
        unless it failed or an answer it was built on was cut off."""
        record.gold = sample.gold
        # Without the hidden tests: the next program graded on this machine could read them.
        record.metadata.update(
            self.metadata(sample),
            sample=recorded_metadata(self.spec, sample, self.options.data_file),
        )
        if record.status != "failed":
            loop = asyncio.get_running_loop()
            try:
                verdict = await loop.run_in_executor(
                    grade_pool, self.grader.grade, record.final_answer, sample
                )
            except Exception as exc:  # noqa: BLE001 - a grader fault is this sample's verdict
                verdict = Verdict("grader_error", f"the grader raised {reason(exc, self.secrets)}")
            record.grade = verdict.to_dict()
        data = record_to_dict(record)
        line = record_line(data)
        status = str((record.grade or {}).get("status", "run_failed"))
        cost = record.totals.cost_usd or 0.0
        # An answer built on a cut-off reply is not kept either: a rerun should ask again,
        # as the call cache does for the truncated call itself.
        truncated = any(call.truncated for call in record.all_calls())
        if key is not None and not truncated and not _is_error(data):
            kept = {"line": line, "run_id": record.run_id, "status": status, "cost": cost}
            samplecache.cache_set(self.cache, key, kept)
        return line, status, cost

    def write(self, fh: IO[bytes], result: _Result) -> None:
        """Append the sample's line and count it; a directory that takes no write
        stops the run."""
        line, status, cost = result
        try:
            write_line(fh, line)
        except OSError as exc:
            self.halt(io_stop(exc, self.samples_path, self.out, self.progress.done), cancel=True)
            return
        progress = self.progress
        progress.done += 1
        progress.verdicts[status] = progress.verdicts.get(status, 0) + 1
        progress.correct += int(status == "correct")
        progress.errors += int(status in ("run_failed", "grader_error"))
        progress.cost_usd += cost
        self.notify(progress)

    def metadata(self, sample: Sample) -> dict[str, Any]:
        """What every record of this run says beside its prompt: the benchmark, the
        strategy and the sample's own question.  ``record.question`` is the prompt, the
        benchmark's template filled in; a reader (``conductor view``'s sample list) wants
        the question without the template's instructions around it."""
        meta: dict[str, Any] = {"benchmark": self.spec.name, "strategy": self.strategy.name}
        question = sample.input.get("question")
        if isinstance(question, str):
            meta["question"] = question
        return meta

    def failed_line(self, question: str, sample: Sample, epoch: int, exc: BaseException) -> str:
        """The record of a sample whose run (or its record) raised ``exc``."""
        name = self.strategy.name
        record = RunRecord(
            question=question,
            pool=self.pool_dict,
            conductor={"backend": "strategy", "strategy": name},
            settings={"sample_index": epoch, "strategy": name},
            sample_id=sample.id,
            epoch=epoch,
            status="failed",
            error=f"the run raised {reason(exc, self.secrets)}",
            finished_at=now_iso(),
            gold=sample.gold,
            metadata=self.metadata(sample),
        )
        return record_line(record_to_dict(record))
