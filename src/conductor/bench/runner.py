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
next run (see :mod:`conductor.runs.lock`).  Sharding takes every N-th sample of the
dataset order; ``merge_runs`` joins the shards of one run.  With a state server
(``--state``), any number of processes run one directory together instead, each
claiming pairs on the server (:mod:`conductor.bench.shared`).

Given the questions a Conductor checkpoint was trained on (``BenchOptions.trained_on``),
``config.json`` records how many of the run's samples are among them (``trained_on``),
and ``exclude_trained`` leaves those samples out of the run altogether.

Here, :func:`run_benchmark` locks the directory and :class:`SampleLoop` runs one pass
over it, one named step at a time.  The parts live beside it: what a run is, the
:class:`~conductor.runs.config.BenchConfig` it writes and whether a resume or a merge
continues it (``runconfig``; the file's format and reader are
:mod:`conductor.runs.config`'s); taking the directory and the work left in it
(``claim``); holding it and undoing an empty run (:mod:`conductor.runs.lock`); why a run
stops and how a fault is told, secrets masked (``faults``); replaying graded samples
from the cache (``samplecache``); joining shards (``merge``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from ..benchmark import BenchmarkSpec
from ..datasets.samples import recorded_metadata, render_prompt
from ..errors import AuthenticationError, CacheError, UsageError
from ..grading import Grader, warm_grader
from ..grading.types import Sample, Verdict
from ..llm.cache import ResponseCache
from ..private import own_dir
from ..record import RunRecord, now_iso, record_to_dict
from ..runs.config import BenchConfig
from ..runs.lock import (
    absent_dirs,
    absent_files,
    join_run_dir,
    lock_run_dir,
    share_lock,
    undo_empty_run,
)
from ..runs.rundir import LOCK, RUN_FILES, SAMPLES, open_samples, record_line, write_line
from ..runs.summary import SummaryBuilder
from ..strategies import Strategy
from . import samplecache
from .claim import (
    check_join,
    check_overwritable,
    claim_run_dir,
    completed_keys,
    is_error_record,
    recorded_keys,
    remaining_work,
    trained_count,
)
from .faults import (
    BenchStopped,
    auth_failure,
    auth_stop,
    cache_stop,
    cap_stop,
    io_stop,
    pool_secrets,
    reason,
    scrub,
)
from .runconfig import BenchOptions, build_config

if TYPE_CHECKING:
    from ..batches.waves import BatchBoard, SampleTicket, WaveBatcher
    from ..llm.cost import SpendMeter
    from ..otel import RecordSink
    from .batchrun import BatchSetup
    from .shared import RunShare

__all__ = [
    "BenchProgress",
    "SampleLoop",
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
    #: Where the run's provider batches stand (``None``: no call is batched).
    batches: BatchBoard | None = None

    @property
    def accuracy(self) -> float | None:
        return 100.0 * self.correct / self.done if self.done else None

    @property
    def nothing_to_run(self) -> bool:
        """Whether every (sample, epoch) had its record before this invocation began
        (a resume of a complete run)."""
        return self.total > 0 and self.done == 0 and self.skipped >= self.total


async def run_benchmark(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    *,
    cache: ResponseCache | None = None,
    on_progress: Callable[[BenchProgress], None] | None = None,
    summary: SummaryBuilder | None = None,
    batching: BatchSetup | None = None,
    meter: SpendMeter | None = None,
    tracer: RecordSink | None = None,
) -> BenchProgress:
    """Run every remaining (sample, epoch) of ``spec`` and append its record.

    With ``tracer`` (``--otel``), each record is handed to it as it is written, to be
    sent as a trace (:mod:`conductor.otel`).

    With ``summary``, the records already in the directory are folded into it once it
    is claimed, and every record written after them as it is written: the caller
    scores the run without reading it back (:class:`SummaryBuilder`).

    With ``cache``, each graded sample is also kept under a key that covers everything
    that decides it (benchmark, prompt, grader, strategy, pool, Conductor settings and
    template, seed, epoch, conductor version), so an identical rerun replays it without
    re-running the workflow.  A replayed record is the original one with a new run id
    and ``replayed_from`` (the original run id and the time of the replay).  Failed runs
    and grader errors are never kept.

    A sample holds one of ``concurrency`` slots while its model calls run and gives it
    up before it is graded; grading runs on its own ``grader_concurrency`` threads.

    With ``batching``, calls of batched targets wait for provider batches sent in waves
    (:mod:`conductor.batches.waves`), whose journal is the directory's
    ``batches.jsonl``; batches an earlier invocation left in flight are collected, not
    sent again.  With ``meter`` (``--max-usd``), which starts at what the records
    already written cost, no sample is started (and, batched, no wave sent) once the
    run has spent its cap: the run stops as :class:`BenchStopped` says.

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
    trained = trained_count(spec, options)
    config = build_config(spec, strategy, grader, pool_dict, options, epochs, trained)
    if options.overwrite:
        check_overwritable(out)
    created = absent_dirs(out)
    try:
        own_dir(out, "the run directory", (*RUN_FILES, LOCK))
    except OSError as exc:
        raise UsageError(f"{out}: cannot create the run directory ({exc.strerror})") from None
    new_files = absent_files(out)
    make_loop = partial(SampleLoop, spec, strategy, grader, pool_dict, options, config, cache,
                        on_progress, batching=batching, meter=meter, tracer=tracer)  # fmt: skip
    if options.state is not None:
        undo = partial(undo_empty_run, out, created, new_files)
        return await _run_shared(spec, options, config, epochs, meter, undo, make_loop)
    # Only a holder of the lock may undo anything: a busy directory is another run's.
    lock = lock_run_dir(out)
    try:
        total = claim_run_dir(spec, options, config, epochs)
        done = completed_keys(out, drop_errors=options.retry_errors)
        if summary is not None:
            summary.read_existing()
            if meter is not None:
                # A whole-run cap: what the records already written cost counts.
                meter.charge(summary.cost_usd)
        loop = make_loop(summary)
        work = _pilot(remaining_work(spec, options, epochs, done), options)
        return await loop.run(_each(work), total=total, skipped=len(done))
    except BenchStopped:
        raise  # its message says how to resume from this directory: it stays
    except Exception:
        undo_empty_run(out, created, new_files)
        raise
    finally:
        lock.close()


async def _run_shared(
    spec: BenchmarkSpec,
    options: BenchOptions,
    config: BenchConfig,
    epochs: int,
    meter: SpendMeter | None,
    undo: Callable[[], None],
    make_loop: Callable[..., SampleLoop],
) -> BenchProgress:
    """:func:`run_benchmark` for a run shared with other processes through the state
    server (:mod:`conductor.bench.shared`): claim the directory as a lone run does, or
    join the processes running it; then run the pairs this process claims there.  The
    summary is not folded in as records are written (the others write too): the
    caller's builder, left unread, scores the whole file at the end."""
    from ..state.spend import SharedSpendMeter
    from .shared import RunShare

    out = options.out_dir
    assert options.state is not None
    share = RunShare(options.state, out)
    lock, first = join_run_dir(out)
    try:
        if first:
            total = claim_run_dir(spec, options, config, epochs)
            done = completed_keys(out, drop_errors=options.retry_errors)
            already = SummaryBuilder(out)
            already.read_existing()  # the spend starts at what the records cost
            share.start(already.cost_usd)
            share_lock(lock)
        else:
            total, done = check_join(spec, options, config, epochs), recorded_keys(out)
            share.join()
        if isinstance(meter, SharedSpendMeter):
            meter.attach(share.claims)
        loop = make_loop(None, share=share)
        work = _pilot(remaining_work(spec, options, epochs, done), options)
        work_claimed = share.claimed(work, halted=lambda: loop.stopped is not None)
        return await loop.run(work_claimed, total=total, skipped=len(done))
    except BenchStopped:
        raise
    except Exception:
        if first:
            undo()
        raise
    finally:
        share.close()
        lock.close()


def _pilot(
    work: Iterator[tuple[Sample, int]], options: BenchOptions
) -> Iterator[tuple[Sample, int]]:
    """``work``, cut to the first ``--pilot N`` pairs when one is given."""
    return work if options.max_pairs is None else islice(work, options.max_pairs)


async def _each(work: Iterator[tuple[Sample, int]]) -> AsyncIterator[tuple[Sample, int]]:
    for pair in work:
        yield pair


class _Result(NamedTuple):
    """What a finished sample leaves to write: its line (encoded once), its status, its
    cost, and the record the line encodes (for the summary)."""

    line: str
    status: str
    cost: float
    record: RunRecord


def _releaser(ticket: SampleTicket) -> Callable[[asyncio.Task[None]], None]:
    def release(_task: asyncio.Task[None]) -> None:
        ticket.release()

    return release


class _Slot:
    """A sample's hold on one of the ``concurrency`` slots, given back once, and with
    it its place in the batcher's waves (its model calls are over)."""

    def __init__(self, slots: asyncio.Semaphore, ticket: SampleTicket | None = None) -> None:
        self._slots: asyncio.Semaphore | None = slots
        self._ticket = ticket

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.release()
        if self._ticket is not None:
            self._ticket.release()


class SampleLoop:
    """One pass of the runner over a run directory already claimed (locked, its
    ``config.json`` written or checked; :mod:`conductor.bench.claim`), in named steps.

    :meth:`run` dispatches one task per (sample, epoch) of the work left
    (:meth:`dispatch`); each task (:meth:`sample`) replays
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
        cache: ResponseCache | None,
        on_progress: Callable[[BenchProgress], None] | None,
        summary: SummaryBuilder | None = None,
        *,
        batching: BatchSetup | None = None,
        meter: SpendMeter | None = None,
        tracer: RecordSink | None = None,
        share: RunShare | None = None,
    ) -> None:
        self.spec, self.strategy, self.grader = spec, strategy, grader
        #: The run's part on the state server, shared with other processes (``None``:
        #: this process runs the directory alone).
        self.share = share
        self.batching, self.meter = batching, meter
        self.tracer = tracer
        #: The run's batcher, opened when the pass starts (``None``: nothing batched).
        self.batcher: WaveBatcher | None = None
        self.summary = summary
        self.pool_dict, self.options = pool_dict, options
        self.cache = cache
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
        self.grader_warmed = False
        #: The first fault that ends the run; set once, read by the dispatcher.
        self.stopped: BenchStopped | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        # Tasks created but not yet started.  A task cancelled before its first step
        # never runs its body, so it cannot hand back the slot and the in-flight place
        # the dispatcher took for it: :meth:`collect` does, or the dispatcher would wait
        # forever.
        self.unstarted: set[asyncio.Task[None]] = set()

    # -- the pass ------------------------------------------------------------------

    async def run(
        self, work: AsyncIterator[tuple[Sample, int]], *, total: int, skipped: int
    ) -> BenchProgress:
        """Run the (sample, epoch) pairs of ``work`` (``skipped`` were recorded before,
        ``total`` is the run's in all) and return this invocation's totals."""
        self.progress.skipped = skipped
        grade_pool = ThreadPoolExecutor(
            max_workers=self.graders, thread_name_prefix="conductor-grade"
        )
        fh = open_samples(self.samples_path)
        try:
            self.progress.total = total
            self.notify(self.progress)
            await self.open_batches()
            await self.dispatch(work, grade_pool, fh)
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

    async def open_batches(self) -> None:
        """Open the run's batcher, taking up the batches an earlier invocation left in
        flight (their answers go to the cache, not to be paid for again)."""
        if self.batching is None:
            return
        meter = self.meter
        self.batcher = self.batching.open(
            self.out,
            on_board=self.on_board,
            gate=meter.refusal if meter is not None else None,
            on_stop=self._cap_halt_batched,
        )
        await self.batcher.start()

    def on_board(self, board: BatchBoard) -> None:
        self.progress.batches = board
        self.notify(self.progress)

    async def dispatch(
        self,
        work: AsyncIterator[tuple[Sample, int]],
        grade_pool: ThreadPoolExecutor,
        fh: IO[bytes],
    ) -> None:
        """Start one task per (sample, epoch) of ``work``, as slots free up, until the
        work ends or a fault stops it; then wait for those in flight.

        Batched, each sample is admitted to the waves before it starts, and the
        dispatcher holds a place of its own until it has started every sample it can
        (a wave must not leave without the samples about to start), given up while it
        waits for a slot (which only the samples' progress frees)."""
        batcher = self.batcher
        own = batcher.admit() if batcher is not None else None
        try:
            while True:
                await self._take(self.pending, own)
                await self._take(self.slots, own)
                self._check_share()
                if self.stopped is None and self.meter is not None:
                    refused = self.meter.refusal()
                    if refused is not None:
                        self._cap_halt(refused)
                # The next pair is drawn once it can start: with --state drawing claims
                # it, and no pair should be held by a process that cannot run it yet.
                pair = await self._next(work, own) if self.stopped is None else None
                if pair is None:
                    self.slots.release()
                    self.pending.release()
                    break
                sample, epoch = pair
                ticket = batcher.admit() if batcher is not None else None
                task = asyncio.create_task(self.sample(sample, epoch, grade_pool, fh, ticket))
                self.tasks.add(task)
                self.unstarted.add(task)
                task.add_done_callback(self.collect)
                if ticket is not None:
                    # However the task ends (cancelled before it started, too).
                    task.add_done_callback(_releaser(ticket))
        finally:
            if own is not None:
                own.release()
        self._check_share()  # the claims end early when the server is lost
        while self.tasks:
            await asyncio.wait(list(self.tasks))

    def _check_share(self) -> None:
        """Stop at once when the state server was lost: nothing in flight may spend
        what no one counts (fail closed)."""
        if self.share is not None and self.stopped is None:
            stop = self.share.stop(self.progress.done)
            if stop is not None:
                self.halt(stop, cancel=True)

    async def _next(
        self, work: AsyncIterator[tuple[Sample, int]], own: SampleTicket | None
    ) -> tuple[Sample, int] | None:
        """The next pair of ``work`` (``None``: no more).  A shared run's may wait for
        other processes' pairs to settle: the dispatcher is then parked, so that the
        waves of the samples in flight leave without it."""
        if own is not None and self.share is not None:
            with own.idle():
                return await anext(work, None)
        return await anext(work, None)

    @staticmethod
    async def _take(slots: asyncio.Semaphore, own: SampleTicket | None) -> None:
        if own is not None and slots.locked():
            with own.idle():
                await slots.acquire()
        else:
            await slots.acquire()

    async def finish(self, grade_pool: ThreadPoolExecutor, fh: IO[bytes]) -> None:
        """Close what the pass opened: the samples file, the grader threads (those still
        grading are abandoned) and the strategy's callers; and wait until the cache
        holds every answer given (its writes are made behind the loop, see
        :mod:`conductor.llm.cache`), so the run reports nothing that is not cached."""
        with suppress(OSError):
            fh.close()
        grade_pool.shutdown(wait=False, cancel_futures=True)
        if self.batcher is not None:
            # Batches still in flight keep running at the provider: the journal has
            # them, and a resume collects them.
            await self.batcher.aclose()
        await self.strategy.aclose()
        if self.cache is not None:
            try:
                await asyncio.to_thread(self.cache.flush)
            except CacheError as exc:
                self._cache_halt(exc)

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

    def _cap_halt(self, why: str) -> None:
        """The run's spend reached ``--max-usd``: start no more samples; those in flight
        finish (their calls are under way)."""
        self.halt(cap_stop(why, self.out, batched=False), cancel=False)

    def _cap_halt_batched(self, why: str) -> None:
        """The cap, met before a wave: the samples in flight wait on calls that will not
        be sent, so they are abandoned (not written: a resume runs them again, their
        answered calls from the cache)."""
        in_flight = self.batcher.in_flight if self.batcher is not None else 0
        self.halt(cap_stop(why, self.out, batched=True, in_flight=in_flight), cancel=True)

    # -- one sample ----------------------------------------------------------------

    async def sample(
        self,
        sample: Sample,
        epoch: int,
        grade_pool: ThreadPoolExecutor,
        fh: IO[bytes],
        ticket: SampleTicket | None = None,
    ) -> None:
        """Run, grade and write one (sample, epoch); its faults are its record, or stop
        the run (refused credentials, a broken cache, a directory that takes no write).
        ``ticket`` is its place in the batcher's waves, given up with its slot."""
        me = asyncio.current_task()
        if me is not None:
            self.unstarted.discard(me)
        if ticket is not None:
            ticket.enter()
        slot = _Slot(self.slots, ticket)
        try:
            result = await self._result(sample, epoch, slot, grade_pool)
            if result is not None:
                self.write(fh, result)
        finally:
            slot.release()
            self.pending.release()
            if self.share is not None:
                self.share.settle(sample.id, epoch)

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
            if not self.grader_warmed:
                # The first sample to be asked: its grade comes after its model calls,
                # which the grader's start-up overlaps.
                self.grader_warmed = True
                warm_grader(self.grader)
            record = await self.ask(question, epoch, sample)
        except AuthenticationError as exc:
            self._auth_halt(exc.describe())
            return None
        except CacheError as exc:
            self._cache_halt(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - any fault of one sample is its record
            slot.release()
            return self.failed_result(question, sample, epoch, exc)
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
            return self.failed_result(question, sample, epoch, exc)

    def replay(self, key: str | None) -> _Result | None:
        """The sample's record kept in the cache under ``key``, as this run's line."""
        kept = samplecache.cache_get(self.cache, key)
        replayed = samplecache.replayed_record(kept)
        if replayed is None:
            # A miss, or an entry this version cannot read: the sample runs again.
            return None
        line, record = replayed
        return _Result(line, str(kept["status"]), float(kept["cost"]), record)

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
        self.describe(record, sample)
        # Without the hidden tests: the next program graded on this machine could read them.
        record.sample_metadata = recorded_metadata(self.spec, sample, self.options.data_file)
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
        if key is not None and not truncated and not is_error_record(data):
            kept = {"line": line, "run_id": record.run_id, "status": status, "cost": cost}
            samplecache.cache_set(self.cache, key, kept)
        return _Result(line, status, cost, record)

    def write(self, fh: IO[bytes], result: _Result) -> None:
        """Append the sample's line and count it; a directory that takes no write
        stops the run."""
        try:
            if self.share is None:
                write_line(fh, result.line)
            elif not self._write_shared(fh, result):
                return
        except OSError as exc:
            self.halt(io_stop(exc, self.samples_path, self.out, self.progress.done), cancel=True)
            return
        if self.summary is not None:
            self.summary.add(result.record)
        if self.tracer is not None:
            self.tracer.emit(result.record, source=str(self.samples_path), line=result.line)
        status, cost = result.status, result.cost
        progress = self.progress
        progress.done += 1
        progress.verdicts[status] = progress.verdicts.get(status, 0) + 1
        progress.correct += int(status == "correct")
        progress.errors += int(status in ("run_failed", "grader_error"))
        progress.cost_usd += cost
        self.notify(progress)

    def _write_shared(self, fh: IO[bytes], result: _Result) -> bool:
        """Write the line by the shared run's protocol (:mod:`conductor.bench.shared`);
        ``False`` when it was not written (the pair is another process's now, or the
        server was lost: the run then stops)."""
        from ..state.claims import StateLost

        assert self.share is not None
        record = result.record
        try:
            return self.share.write(
                fh.fileno(), str(record.sample_id), int(record.epoch or 0), result.line
            )
        except StateLost:
            self._check_share()
            return False

    def describe(self, record: RunRecord, sample: Sample) -> None:
        """What every record of this run says beside its prompt: the benchmark, the
        strategy and the sample's own question (and its choices, when it has them).
        ``record.question`` is the prompt, the benchmark's template filled in; a reader
        (``conductor view``'s sample list) wants the question without the template's
        instructions around it, and a router fitted on the run keys its questions as a
        bench keys its samples (:func:`~conductor.datasets.questions.sample_key`: a
        multiple-choice question's key covers its choices)."""
        record.benchmark = self.spec.name
        record.strategy = self.strategy.name
        question = sample.input.get("question")
        if isinstance(question, str):
            record.sample_question = question
            choices = sample.input.get("choices")
            if isinstance(choices, (list, tuple, dict)) and choices:
                record.sample_choices = list(choices) if isinstance(choices, tuple) else choices

    def failed_result(
        self, question: str, sample: Sample, epoch: int, exc: BaseException
    ) -> _Result:
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
        )
        self.describe(record, sample)
        return _Result(record_line(record_to_dict(record)), "run_failed", 0.0, record)
