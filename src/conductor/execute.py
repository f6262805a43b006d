"""Running one question: Conductor -> workflow -> steps -> record.

Each step starts as soon as every step it can see has finished, so steps that see
nothing run at the same time.  A step's messages depend only on the question, its
subtask and the responses it can see, so the answers are exactly those of running the
steps one after another.  Budgets (steps, rounds, calls, USD) bound each question; a
worker that still fails after its retries is recorded as failed and the rest of the
workflow runs where it can.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .cache import ResponseCache
from .conductors.prompt import (
    PreviousRound,
    build_conductor_messages,
    build_reask_messages,
    conductor_prefill,
    fit_prefill,
)
from .conductors.spec import Conductor
from .context import SharedStep, build_worker_messages, worker_prefills
from .errors import CONDUCTOR_TARGET, ModelCallError, UsageError, WorkflowParseError
from .events import Event, EventSink, null_sink
from .llm.caller import CallerSet
from .llm.cost import failed_call_cost
from .llm.prefill import join_prefill
from .llm.types import Completion, Message, ModelRequest
from .pool import Pool, Worker, pool_to_public_dict
from .record import CallRecord, RoundRecord, RunRecord, StepRecord, Totals, now_iso
from .text import check_question, plural, strip_think
from .workflow import ALL, Workflow, format_workflow, parse_workflow, workflow_to_dict

__all__ = [
    "INTERRUPTED",
    "Budget",
    "Orchestrator",
    "RunSettings",
    "ask",
    "finish_interrupted",
    "last_plan_reply",
]

log = logging.getLogger("conductor")


@dataclass(frozen=True)
class RunSettings:
    """Per-question limits and sampling.

    ``rounds`` is the most Conductor rounds (1 = no recursion).  ``max_calls`` and
    ``budget_usd`` count every model call, the Conductor's included, and count cached
    calls as if they were made, so that a cached rerun behaves like the cold run.
    ``sample_index`` separates repeated samples (epochs) of one question in the cache.
    """

    max_steps: int | None = None
    rounds: int = 1
    budget_usd: float | None = None
    max_calls: int | None = None
    sample_index: int = 0


@dataclass
class Budget:
    """Running spend of one question against its limits."""

    max_calls: int | None = None
    max_usd: float | None = None
    calls: int = 0
    usd: float = 0.0

    def refusal(self) -> str | None:
        """Why one more call may not start, or ``None`` if it may."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            return f"call budget reached ({plural(self.max_calls, 'call')})"
        if self.max_usd is not None and self.usd >= self.max_usd:
            return f"USD budget reached (${self.usd:.4f} of ${self.max_usd:.4f})"
        return None

    def charge(self, cost: float | None) -> None:
        self.usd += cost or 0.0


class SampleIndexer:
    """The sample index of each request in one run, over all of its rounds.

    Identical requests (say, two independent attempts with the same instruction to the
    same worker, or a revision round repeating a step of round 1) are separate samples
    on purpose: each gets its own index, so the cache does not hand the second the first
    one's reply, and a run gives the same kind of record with the cache as without.
    ``base`` separates epochs.
    """

    def __init__(self, base: int) -> None:
        self._base = base * 1000
        self._seen: dict[str, int] = {}

    def next(self, worker_id: str, messages: list[Message]) -> int:
        key = json.dumps([worker_id, messages], ensure_ascii=False)
        repeat = self._seen.get(key, 0)
        self._seen[key] = repeat + 1
        return self._base + repeat


@dataclass
class _History:
    """What the rounds of one run carry over: the steps of finished rounds, which
    ``"all"`` steps of later rounds also see, and the run's sample indices."""

    samples: SampleIndexer
    steps: list[SharedStep] = field(default_factory=list)


def _call_record(messages: list[Message], started: str) -> CallRecord:
    return CallRecord(messages=messages, started_at=started)


def fill_call(call: CallRecord, completion: Completion) -> None:
    call.response = completion.text
    call.input_tokens = completion.usage.input_tokens
    call.output_tokens = completion.usage.output_tokens
    call.cost_usd = completion.cost_usd
    call.latency_s = round(completion.latency_s, 6)
    call.cached = completion.cached
    call.attempts = completion.attempts
    call.raw = completion.raw
    call.finish_reason = completion.finish_reason
    call.truncated = completion.truncated
    call.finished_at = now_iso()


def fail_call(call: CallRecord, exc: ModelCallError, latency_s: float, target: Worker) -> None:
    call.error = exc.describe()
    call.cost_usd = failed_call_cost(target)
    call.error_kind = type(exc).__name__
    call.attempts = int(getattr(exc, "attempts", 1))
    call.latency_s = round(latency_s, 6)
    call.finished_at = now_iso()


class Orchestrator:
    """Runs questions against one pool and one Conductor.

    One orchestrator holds the callers (clients, per-worker concurrency limits and the
    cache), so many questions can run on it at once, e.g. from ``conductor bench``.
    """

    def __init__(
        self,
        pool: Pool,
        conductor: Conductor,
        *,
        cache: ResponseCache | None = None,
        callers: CallerSet | None = None,
    ) -> None:
        if not pool.workers:
            raise UsageError(f"pool {pool.name!r} has no workers")
        self.pool = pool
        self.conductor = conductor
        self.callers = callers if callers is not None else CallerSet(cache)
        self._pool_dict = pool_to_public_dict(pool)
        self._conductor_dict = conductor.describe()
        self._grammar_cache: dict[tuple[int, int, bool], str] = {}
        self._prefills = worker_prefills(pool.workers)

    async def aclose(self) -> None:
        await self.callers.aclose()

    async def __aenter__(self) -> Orchestrator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the Conductor -------------------------------------------------------------

    def _grammar(self, allow_empty: bool, max_steps: int) -> str | None:
        if not self.conductor.constrained:
            return None
        key = (len(self.pool.workers), max_steps, allow_empty)
        if key not in self._grammar_cache:
            from .grammar import workflow_grammar

            cond = self.conductor
            self._grammar_cache[key] = workflow_grammar(
                len(self.pool.workers),
                max_steps,
                allow_empty=allow_empty,
                max_reasoning_chars=cond.max_reasoning_chars,
                min_subtask_chars=cond.min_subtask_chars,
                max_subtask_chars=cond.max_subtask_chars,
                subtask_choices=cond.subtasks,
            )
        return self._grammar_cache[key]

    async def _plan(
        self,
        question: str,
        rnd: RoundRecord,
        previous: PreviousRound | None,
        settings: RunSettings,
        budget: Budget,
        emit: EventSink,
        given: str | None = None,
    ) -> Workflow | None:
        """Ask the Conductor for a workflow, re-asking with the reason when it does not
        parse.  Returns ``None`` when every try failed or the budget ran out.

        ``given`` is a reply the Conductor already wrote (a trainer's rollout): it is
        recorded as this round's Conductor call and parsed once, with no re-asking.
        """
        cond = self.conductor
        max_steps = settings.max_steps or cond.max_steps
        allow_empty = previous is not None
        messages = build_conductor_messages(
            question,
            self.pool.workers,
            max_steps=max_steps,
            template=cond.template,
            show_descriptions=cond.show_descriptions,
            previous=previous,
            subtasks=cond.subtasks,
        )
        messages = fit_prefill(messages, cond.target)
        prefill = conductor_prefill(messages)
        if given is not None:
            call = _call_record(list(messages), now_iso())
            if prefill and given.startswith(prefill):
                # Some trainers hand back the prefill with the completion.
                given = given[len(prefill) :]
            call.response = given
            call.prefill = prefill
            call.finished_at = call.started_at
            rnd.conductor_calls.append(call)
            try:
                return parse_workflow(
                    join_prefill(messages, given),
                    n_workers=len(self.pool.workers),
                    max_steps=max_steps,
                    allow_empty=allow_empty,
                )
            except WorkflowParseError as exc:
                rnd.parse_errors.append(exc.reason)
                rnd.stop_reason = f"the given Conductor reply could not be parsed: {exc.reason}"
                return None
        if prefill is not None:
            self.conductor.check_prefill()
        grammar = self._grammar(allow_empty, max_steps)
        caller = self.callers.get(cond.target)
        for attempt in range(cond.parse_retries + 1):
            refusal = budget.refusal()
            if refusal is not None:
                rnd.stop_reason = refusal
                return None
            emit(Event("conductor_started", rnd.index, detail=f"try {attempt + 1}"))
            call = _call_record(list(messages), now_iso())
            rnd.conductor_calls.append(call)
            budget.calls += 1
            t0 = time.perf_counter()
            try:
                completion = await caller.complete(
                    ModelRequest(
                        messages=tuple(messages),
                        params=cond.target.params,
                        sample_index=settings.sample_index,
                        grammar=grammar,
                    )
                )
            except ModelCallError as exc:
                fail_call(
                    call, exc.with_target(CONDUCTOR_TARGET), time.perf_counter() - t0, cond.target
                )
                emit(Event("conductor_finished", rnd.index, failed=True, detail=call.error))
                rnd.stop_reason = call.error  # "the Conductor failed: ..."
                return None
            fill_call(call, completion)
            call.prefill = conductor_prefill(messages)
            budget.charge(completion.cost_usd)
            try:
                workflow = parse_workflow(
                    join_prefill(messages, completion.text),
                    n_workers=len(self.pool.workers),
                    max_steps=max_steps,
                    allow_empty=allow_empty,
                )
            except WorkflowParseError as exc:
                rnd.parse_errors.append(exc.reason)
                emit(Event("conductor_parse_failed", rnd.index, detail=exc.reason))
                messages = build_reask_messages(messages, completion.text, exc.reason)
                continue
            emit(
                Event(
                    "conductor_finished",
                    rnd.index,
                    cached=completion.cached,
                    latency_s=completion.latency_s,
                    detail=plural(len(workflow.steps), "step"),
                )
            )
            return workflow
        rnd.stop_reason = (
            f"the Conductor's reply could not be parsed after {cond.parse_retries + 1} tries: "
            f"{rnd.parse_errors[-1]}"
        )
        return None

    # -- the steps -----------------------------------------------------------------

    async def _run_steps(
        self,
        question: str,
        workflow: Workflow,
        rnd: RoundRecord,
        history: _History,
        settings: RunSettings,
        budget: Budget,
        emit: EventSink,
    ) -> None:
        n = len(workflow.steps)
        done = [asyncio.Event() for _ in range(n)]
        shared: list[SharedStep | None] = [None] * n
        records: list[StepRecord | None] = [None] * n
        samples = history.samples

        async def run_step(i: int) -> None:
            step = workflow.steps[i]
            visible = step.visible(i)
            for j in visible:
                await done[j].wait()
            worker: Worker = self.pool.workers[step.worker]
            context = [s for s in (shared[j] for j in visible) if s is not None]
            if step.access == ALL:
                context = [*history.steps, *context]
            messages = build_worker_messages(
                question,
                context,
                step.subtask,
                keep_reasoning=worker.context.reasoning == "keep",
                prefill=self._prefills.get(worker.id),
                form=worker.context.message,
            )
            call = _call_record(messages, now_iso())
            rec = StepRecord(
                index=i,
                worker_index=step.worker,
                worker_id=worker.id,
                model=worker.model,
                subtask=step.subtask,
                access=["all"] if step.access == ALL else list(step.access),
                visible_steps=list(visible),
                call=call,
            )
            records[i] = rec
            try:
                refusal = budget.refusal()
                if refusal is not None:
                    rec.status = "skipped"
                    call.error = refusal
                    call.error_kind = "BudgetExceeded"
                    call.cost_usd = 0.0  # never sent
                    return
                budget.calls += 1
                sample_index = samples.next(worker.id, messages)
                emit(Event("step_started", rnd.index, step=i, worker_id=worker.id))
                t0 = time.perf_counter()
                try:
                    completion = await self.callers.get(worker).complete(
                        ModelRequest(
                            messages=tuple(messages),
                            params=worker.params,
                            sample_index=sample_index,
                        )
                    )
                except ModelCallError as exc:
                    fail_call(call, exc.with_target(worker.id), time.perf_counter() - t0, worker)
                    rec.status = "failed"
                    emit(
                        Event(
                            "step_finished",
                            rnd.index,
                            step=i,
                            worker_id=worker.id,
                            failed=True,
                            detail=call.error,
                        )
                    )
                    shared[i] = SharedStep(f"{rnd.index}.{i}", step.worker, step.subtask, None)
                    return
                fill_call(call, completion)
                budget.charge(completion.cost_usd)
                # The call records what the provider returned; the answer is the reply
                # as the worker wrote it, its prefill included.
                reply = join_prefill(messages, completion.text)
                rec.answer = strip_think(reply).strip()
                shared[i] = SharedStep(
                    f"{rnd.index}.{i}", step.worker, step.subtask, rec.answer, reply.strip()
                )
                emit(
                    Event(
                        "step_finished",
                        rnd.index,
                        step=i,
                        worker_id=worker.id,
                        cached=completion.cached,
                        latency_s=completion.latency_s,
                    )
                )
            finally:
                done[i].set()

        try:
            await asyncio.gather(*(run_step(i) for i in range(n)))
        finally:
            # Also when cancelled: an interrupted run's record keeps the steps it did.
            rnd.steps = [r for r in records if r is not None]
            history.steps.extend(s for s in shared if s is not None)

    # -- one question --------------------------------------------------------------

    async def run(
        self,
        question: str,
        settings: RunSettings | None = None,
        *,
        events: EventSink | None = None,
        sample_id: str | None = None,
        epoch: int | None = None,
        metadata: dict[str, Any] | None = None,
        plan: str | None = None,
        continue_from: RunRecord | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
    ) -> RunRecord:
        """Run ``question`` and return its full record (never raises for model errors:
        failures are in the record's ``status`` and ``error``).

        ``on_record`` is called with the record as soon as it exists.  It fills in as
        the run goes, so a caller that cancels the run (``Ctrl-C``) still holds the
        steps done so far: a cancelled run's record is finished with the calls in flight
        marked interrupted (:func:`finish_interrupted`) before the cancellation goes on.

        ``plan`` is the Conductor's reply for the first round this call runs, already
        written (by a trainer's rollout, say); it is executed instead of asking the
        Conductor.  ``continue_from`` is an earlier record of the same question: its
        rounds are kept, the Conductor sees its last plan and answer, and workers given
        ``"all"`` see its steps, so this call runs at least one more (revision) round.
        """
        # The CLI and the data loaders check too; a library caller gets the same refusal
        # before anything is paid for.
        check_question(question)
        settings = settings or RunSettings()
        emit = events or null_sink
        max_steps = settings.max_steps or self.conductor.max_steps
        record = RunRecord(
            question=question,
            pool=self._pool_dict,
            conductor=self._conductor_dict,
            settings={
                "max_steps": max_steps,
                "rounds": settings.rounds,
                "budget_usd": settings.budget_usd,
                "max_calls": settings.max_calls,
                "sample_index": settings.sample_index,
            },
            sample_id=sample_id,
            epoch=epoch,
            metadata=dict(metadata or {}),
        )
        budget = Budget(max_calls=settings.max_calls, max_usd=settings.budget_usd)
        history = _History(SampleIndexer(settings.sample_index))
        previous: PreviousRound | None = None
        answer: str | None = None
        start = 0
        if continue_from is not None:
            previous, answer = _continue(record, continue_from, history)
            start = len(record.rounds)
            if previous is not None:
                previous = replace(previous, reply=last_plan_reply(continue_from))
        if on_record is not None:
            on_record(record)
        t0 = time.perf_counter()
        try:
            await self._rounds(
                question, record, history, previous, answer, start, settings, budget, emit, plan
            )
        except asyncio.CancelledError:
            finish_interrupted(record, time.perf_counter() - t0)
            raise
        finish_record(record, time.perf_counter() - t0)
        emit(Event("run_finished", len(record.rounds) - 1, failed=record.status == "failed"))
        return record

    async def _rounds(
        self,
        question: str,
        record: RunRecord,
        history: _History,
        previous: PreviousRound | None,
        answer: str | None,
        start: int,
        settings: RunSettings,
        budget: Budget,
        emit: EventSink,
        plan: str | None,
    ) -> None:
        """Run the Conductor rounds of ``record``, filling it in (final answer included)."""
        for r in range(start, max(start + 1, settings.rounds)):
            rnd = RoundRecord(index=r)
            record.rounds.append(rnd)
            workflow = await self._plan(
                question, rnd, previous, settings, budget, emit, plan if r == start else None
            )
            if workflow is None:
                break
            rnd.workflow = workflow_to_dict(workflow)
            if workflow.is_empty:
                rnd.stop_reason = "the Conductor kept the previous answer"
                rnd.final_answer = answer
                emit(Event("round_finished", r, detail=rnd.stop_reason))
                break
            await self._run_steps(question, workflow, rnd, history, settings, budget, emit)
            round_answer = next(
                (s.answer for s in reversed(rnd.steps) if s.status == "ok" and s.answer),
                None,
            )
            if round_answer is not None:
                answer = round_answer
            rnd.final_answer = round_answer
            emit(Event("round_finished", r))
            if round_answer is None:
                rnd.stop_reason = "no step of this round gave an answer"
                break
            previous = PreviousRound(format_workflow(workflow), round_answer, _plan_reply(rnd))
        else:
            if settings.rounds > 1:
                record.rounds[-1].stop_reason = (
                    record.rounds[-1].stop_reason or f"round budget reached ({settings.rounds})"
                )
        record.final_answer = answer


def _continue(
    record: RunRecord, earlier: RunRecord, history: _History
) -> tuple[PreviousRound | None, str | None]:
    """Seed ``record`` with the rounds of ``earlier``; return what the next round sees."""
    from .workflow import workflow_from_dict

    record.rounds = list(earlier.rounds)
    last_plan: Workflow | None = None
    for rnd in earlier.rounds:
        if rnd.workflow:
            last_plan = workflow_from_dict(rnd.workflow)
        for s in rnd.steps:
            ok = s.status == "ok"
            answer = s.answer if ok else None
            reasoned = None
            if ok and s.call.response is not None:
                reasoned = join_prefill(s.call.messages, s.call.response).strip()
            history.steps.append(
                SharedStep(f"{rnd.index}.{s.index}", s.worker_index, s.subtask, answer, reasoned)
            )
            if s.status != "skipped":
                # Requests already made keep their indices: a repeat is a new sample.
                history.samples.next(s.worker_id, s.call.messages)
    if last_plan is None or earlier.final_answer is None:
        return None, earlier.final_answer
    return PreviousRound(format_workflow(last_plan), earlier.final_answer), earlier.final_answer


def _plan_reply(rnd: RoundRecord) -> str | None:
    """The Conductor's whole reply (prefill included) that gave round ``rnd`` its plan:
    the last of its tries, the one that parsed."""
    return rnd.conductor_calls[-1].reply if rnd.conductor_calls else None


def last_plan_reply(record: RunRecord) -> str | None:
    """The reply that wrote ``record``'s last plan (what a revision round continues)."""
    last = next((rnd for rnd in reversed(record.rounds) if rnd.workflow), None)
    return _plan_reply(last) if last is not None else None


def finish_record(record: RunRecord, wall_s: float) -> None:
    totals = Totals(wall_s=round(wall_s, 6))
    cost = 0.0
    for call in record.all_calls():
        if call.response is None and call.error is None:
            continue
        totals.calls += 1
        totals.cached_calls += int(call.cached)
        totals.failed_calls += int(call.error is not None)
        totals.input_tokens += call.input_tokens
        totals.output_tokens += call.output_tokens
        if call.error is None and call.cost_usd is None:
            totals.unknown_cost_calls += 1
        cost += call.cost_usd or 0.0
    totals.cost_usd = round(cost, 8)
    record.totals = totals
    record.finished_at = now_iso()
    failed_steps = [s for rnd in record.rounds for s in rnd.steps if s.status != "ok"]
    if record.final_answer is None:
        record.status = "failed"
        reasons = [rnd.stop_reason for rnd in record.rounds if rnd.stop_reason]
        step_errors = [
            f"step {s.index} ({s.worker_id}): {s.call.error}" for s in failed_steps if s.call.error
        ]
        if step_errors:
            reasons = ["no step gave an answer: " + "; ".join(step_errors)]
        record.error = reasons[0] if reasons else "no answer was produced"
    elif failed_steps:
        record.status = "partial"
        record.error = "; ".join(
            f"step {s.index} ({s.worker_id}): {s.call.error}" for s in failed_steps
        )
    else:
        record.status = "ok"


#: The error of a run, and of each call, that was cancelled before it finished.
INTERRUPTED = "interrupted before it finished"


def finish_interrupted(record: RunRecord, wall_s: float) -> None:
    """Finish the record of a run cancelled part-way: the calls in flight are marked
    interrupted, the answer is the last round's that gave one, and the run is
    ``partial`` with such an answer, else ``failed``, its error saying it was
    interrupted."""
    for rnd in record.rounds:
        for call in rnd.conductor_calls:
            _interrupt(call)
        for step in rnd.steps:
            if _interrupt(step.call):
                step.status = "failed"
    if record.final_answer is None:
        record.final_answer = next(
            (rnd.final_answer for rnd in reversed(record.rounds) if rnd.final_answer), None
        )
    finish_record(record, wall_s)
    record.status = "failed" if record.final_answer is None else "partial"
    record.error = f"the run was {INTERRUPTED}"


def _interrupt(call: CallRecord) -> bool:
    """Mark ``call`` interrupted if it was still waiting for its reply."""
    if call.response is not None or call.error is not None:
        return False
    call.error = INTERRUPTED
    call.error_kind = "Interrupted"
    call.finished_at = now_iso()
    return True


async def ask(
    question: str,
    pool: Pool,
    conductor: Conductor,
    settings: RunSettings | None = None,
    *,
    cache: ResponseCache | None = None,
    events: EventSink | None = None,
    on_record: Callable[[RunRecord], None] | None = None,
) -> RunRecord:
    """Run one question and close the clients afterwards (``on_record`` as for
    :meth:`Orchestrator.run`)."""
    async with Orchestrator(pool, conductor, cache=cache) as orch:
        return await orch.run(question, settings, events=events, on_record=on_record)
