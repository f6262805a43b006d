"""What a running server holds, apart from HTTP: the shared callers and cache, the
catalog of models, the slots requests wait for, the processes that check structured
answers, and the records file.

The stores of what outlives a request (stored conversations, keys' budgets:
:mod:`._stores`) are opened with the service, on the state server when ``--state``
names one.

One :class:`Service` lives from the app's startup to its shutdown, in the server's
event loop.  Every request's runs go through :meth:`Service.run_all`, so they share one
:class:`~conductor.llm.caller.CallerSet` (clients, per-worker limits, the call cache)
and each finished run's record is appended to ``samples.jsonl`` whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from ..conductors.spec import Conductor
from ..events import Event
from ..execute import RunSettings
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.cache import ResponseCache
from ..llm.caller import CallerSet
from ..llm.check_workers import CheckerPool, CheckRunner, RequestChecks
from ..pool import Pool
from ..private import own_dir
from ..record import BudgetRecord, RunRecord, record_to_dict
from ..runs.rundir import SAMPLES, open_samples, record_line, repair_tail, write_line
from ..state import open_call_cache, open_rates
from ..steps import Budget
from ..strategies import Strategy
from ..text import plural
from ..workflow import workflow_from_dict
from ._models import Catalog
from ._protocol import ApiError, RequestBudget, event_payload
from ._settings import ServeSettings
from ._spend import Spending
from ._stores import Stores, open_stores

if TYPE_CHECKING:
    from ..otel import ProcessTracer, RecordSink

__all__ = ["EventCallback", "RecordWriter", "Service", "Slots", "Ticket", "check_records_dir"]

log = logging.getLogger("conductor")

_Limit = TypeVar("_Limit", int, float)

#: Receives each progress event of a request's runs, as JSON.
EventCallback = Callable[[dict[str, Any]], None]


class Slots:
    """At most ``limit`` requests run at once and ``queue`` more wait; a request beyond
    those is refused (429) at once rather than left waiting without end.  ``served``
    counts the requests that had a place and are done with it (answered, failed, or
    given up by their client)."""

    def __init__(self, limit: int, queue: int) -> None:
        self.limit = limit
        self.queue = queue
        self.admitted = 0
        self.served = 0
        self._running = asyncio.Semaphore(limit)

    def admit(self) -> Ticket:
        """A place for one request, or :class:`ApiError` 429 when all are taken."""
        if self.admitted >= self.limit + self.queue:
            raise ApiError(
                429,
                f"the server is busy: {plural(self.limit, 'request')} "
                f"{'is' if self.limit == 1 else 'are'} running and {self.queue} "
                f"{'is' if self.queue == 1 else 'are'} waiting; retry in a moment",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        self.admitted += 1
        return Ticket(self)


class Ticket:
    """One admitted request's place: wait in :meth:`running` for a slot; give the place
    back with :meth:`release` (more than once is harmless)."""

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._released = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self._slots._running:
            yield

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._slots.admitted -= 1
            self._slots.served += 1


def check_records_dir(directory: Path) -> None:
    """Make ``directory`` and check that its ``samples.jsonl`` can be appended to (an
    ``OSError`` naming the path otherwise), cutting a torn last line left by a kill."""
    own_dir(directory, "the records directory", (SAMPLES, f"{SAMPLES}.tmp"))
    path = directory / SAMPLES
    repair_tail(path)
    open_samples(path).close()


class RecordWriter:
    """Appends run records to ``DIR/samples.jsonl``, one whole line each: a lock keeps
    lines of concurrent runs from interleaving, and the file is unbuffered, so a
    record is on disk when :meth:`write` returns."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / SAMPLES
        self._lock = threading.Lock()
        self._fh: IO[bytes] | None = open_samples(self.path)

    def write(self, record: RunRecord) -> None:
        line = record_line(record_to_dict(record))
        with self._lock:
            if self._fh is None:
                raise OSError(f"{self.path}: the records file is closed")
            write_line(self._fh, line)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def _close_tracer(tracer: ProcessTracer) -> None:
    """Send what is left; spans that could not be sent are logged (a server has no
    closing summary to put them in)."""
    problem = tracer.close().problem()
    if problem is not None:
        log.warning("traces: %s", problem)


class Service:
    """The shared state of a running server (see the module docstring)."""

    def __init__(
        self,
        settings: ServeSettings,
        conductor: Conductor,
        cache: ResponseCache | None,
        records: RecordWriter | None,
        tracer: RecordSink | None = None,
        stores: Stores | None = None,
    ) -> None:
        self.settings = settings
        #: Stored conversations and keys' budgets: this process's, or the state server's.
        self.stores = stores if stores is not None else open_stores(None)
        self.spending = Spending(self.stores.budgets)
        self.cache = cache
        self.records = records
        #: Where each run's record becomes a trace (``--otel``), or ``None``.
        self.tracer = tracer
        callers = CallerSet(cache, rates=open_rates(settings.state))
        callers.declare(settings.pool.workers)
        self.catalog = Catalog(
            settings.pool,
            conductor,
            callers,
            RunSettings(),
            max_k=settings.max_k,
            router=settings.router,
        )
        self.slots = Slots(settings.max_concurrency, settings.max_queue)
        #: Where requests' JSON checks run: processes that can be killed at a budget,
        #: so that no check holds the event loop (see :mod:`conductor.llm.check_workers`).
        self.checkers: CheckRunner = CheckerPool()

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(cls, settings: ServeSettings, conductor: Conductor) -> AsyncIterator[Service]:
        """A service for the server's lifetime: the cache and the records file are
        closed, and the clients too, when the block ends."""
        with contextlib.ExitStack() as stack:
            cache = (
                stack.enter_context(open_call_cache(settings.state)) if settings.use_cache else None
            )
            records = None
            if settings.records_dir is not None:
                records = RecordWriter(settings.records_dir)
                stack.callback(records.close)
            tracer = None
            if settings.otel is not None:
                from ..otel import open_tracer

                opened_tracer = open_tracer(settings.otel)
                stack.callback(_close_tracer, opened_tracer)
                tracer = opened_tracer
            service = cls(settings, conductor, cache, records, tracer, open_stores(settings.state))
            try:
                if settings.new_budgets or any(k.has_budget for k in settings.keys):
                    await service.spending.open(new=settings.new_budgets)
                yield service
            finally:
                await service.checkers.aclose()
                await service.catalog.aclose()
                await service.spending.aclose()  # what ran is settled before the stores close
                await service.stores.aclose()

    def request_checks(self) -> RequestChecks:
        """The checks of one request, on one budget, in the service's checkers."""
        return RequestChecks(self.checkers)

    def budget(self, asked: RequestBudget) -> Budget:
        """One request's budget, for all its runs: what it asked, capped by the server's
        ceilings (a request asking more gets the ceiling; its ``conductor`` field says
        which limits applied)."""
        s = self.settings
        return Budget(
            max_calls=_least(asked.max_calls, s.max_calls_per_request),
            max_usd=_least(asked.max_usd, s.max_usd_per_request),
        )

    async def run_all(
        self,
        strategy: Strategy,
        question: str,
        run_ids: list[str],
        on_event: EventCallback | None = None,
        budget: Budget | None = None,
        answer_format: AnswerFormat = PLAIN,
        traceparent: str | None = None,
    ) -> list[RunRecord]:
        """One run of ``question`` per id in ``run_ids`` (sample index 0, 1, ...), at
        once, all drawing on ``budget``; cancelling this cancels them all (their pending
        calls are not made)."""

        def one(index: int, run_id: str) -> Awaitable[RunRecord]:
            return self.run_one(
                strategy,
                question,
                index,
                run_id,
                on_event,
                budget=budget,
                answer_format=answer_format,
                traceparent=traceparent,
            )

        if len(run_ids) == 1:
            return [await one(0, run_ids[0])]
        tasks = [asyncio.ensure_future(one(i, run_id)) for i, run_id in enumerate(run_ids)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # a sibling that raised, or a cancellation, stops the rest
                task.cancel()

    async def run_one(
        self,
        strategy: Strategy,
        question: str,
        index: int,
        run_id: str,
        on_event: EventCallback | None = None,
        budget: Budget | None = None,
        answer_format: AnswerFormat = PLAIN,
        traceparent: str | None = None,
    ) -> RunRecord:
        """One run, recorded under ``run_id`` (its record's run id and sample id), its
        answer in ``answer_format``, drawing on ``budget`` (shared with the request's
        other runs; ``None``: a budget of the server's ceilings for this run alone).  A
        cancelled run's record, as far as it went, is written too where it exists."""
        budget = budget if budget is not None else self.budget(RequestBudget())
        started: list[RunRecord] = []
        sink = self._sink(index, started, on_event, strategy) if on_event else None
        try:
            record = await strategy.run(
                question,
                sample_index=index,
                sample_id=run_id,
                events=sink,
                on_record=started.append,
                budget=budget,
                answer_format=answer_format,
            )
        except asyncio.CancelledError:
            if started:
                self._keep(started[0], run_id, strategy, budget, traceparent)
            raise
        self._keep(record, run_id, strategy, budget, traceparent)
        return record

    def _keep(
        self,
        record: RunRecord,
        run_id: str,
        strategy: Strategy,
        budget: Budget,
        traceparent: str | None = None,
    ) -> None:
        # The run id is the server's, known before the run starts, so that a streamed
        # response can name it in its headers.
        record.run_id = run_id
        # The model the request named, as a bench record names its strategy: one
        # records file holds every model's runs, and a reader (conductor view) tells
        # them apart by it.
        record.strategy = strategy.name
        # The workers the request could use (its key's and its own allowed_workers):
        # a restricted request runs on the sub-pool of just those.
        record.allowed_workers = [w.id for w in strategy.pool.workers]
        # The request's budget (its limits, and the calls, spend and refusal of the
        # whole request when this run ended), which the response's conductor field shows.
        record.budget = BudgetRecord(
            max_calls=budget.max_calls,
            max_usd=budget.max_usd,
            calls=budget.calls,
            usd=round(budget.usd, 8),
            stopped=budget.stopped,
        )
        if self.tracer is not None:
            self.tracer.emit(record, traceparent=traceparent)
        if self.records is None:
            return
        try:
            self.records.write(record)
        except OSError as exc:
            log.error("run %s: its record could not be written (%s)", run_id, exc)

    def _sink(
        self, index: int, started: list[RunRecord], on_event: EventCallback, strategy: Strategy
    ) -> Callable[[Event], None]:
        """An event sink that hands ``on_event`` each event as JSON, preceded, when a
        round's first step starts, by a ``workflow`` event with the round's plan."""
        shown: set[int] = set()

        def sink(event: Event) -> None:
            if event.kind == "step_started" and event.round not in shown:
                shown.add(event.round)
                plan = self._plan(started, event.round, strategy.pool)
                if plan is not None:
                    on_event({"kind": "workflow", "choice": index, "round": event.round, **plan})
            on_event(event_payload(event, index))

        return sink

    def _plan(
        self, started: list[RunRecord], round_index: int, pool: Pool
    ) -> dict[str, Any] | None:
        # The strategy hands over its record before the first step starts, and each
        # round's workflow is in it before that round's steps start.
        rounds = started[0].rounds if started else []
        workflow = rounds[round_index].workflow if round_index < len(rounds) else None
        if not workflow:
            return None
        workers = pool.workers  # the steps number the strategy's (sub-)pool's workers
        return {
            "steps": [
                {
                    "worker": workers[step.worker].id,
                    "subtask": step.subtask,
                    "access": step.recorded_access(),
                }
                for step in workflow_from_dict(workflow, lenient=True).steps
            ]
        }


def _least(asked: _Limit | None, ceiling: _Limit | None) -> _Limit | None:
    """The smaller of two limits, ``None`` standing for none."""
    if asked is None or ceiling is None:
        return ceiling if asked is None else asked
    return min(asked, ceiling)
