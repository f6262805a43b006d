"""Running one question: Conductor -> workflow -> steps -> record.

The Conductor writes a workflow (re-asked with the reason when its reply does not
parse), and a :class:`~conductor.steps.StepRunner` runs its steps, the body of a step
being the one the baselines share (``steps.py``).  A step's messages depend only on the
question, its subtask and the responses it can see, so the answers are exactly those of
running the steps one after another.  Budgets (steps, rounds, calls, USD) bound each
question; a worker that still fails after its retries is recorded as failed and the
rest of the workflow runs where it can.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

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
from .llm.answer_format import PLAIN, AnswerFormat
from .llm.cache import ResponseCache
from .llm.caller import CallerSet
from .llm.prefill_rules import join_prefill
from .llm.types import Message, ModelRequest
from .pool import Pool, pool_to_public_dict
from .record import CallRecord, RoundRecord, RunRecord, now_iso
from .steps import (
    Budget,
    StepPlan,
    StepRunner,
    fail_call,
    fill_call,
    run_to_record,
)
from .text import check_question, plural
from .workflow import ALL, Workflow, format_workflow, parse_workflow, workflow_to_dict

__all__ = [
    "Orchestrator",
    "RunSettings",
    "ask",
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


def _call_record(messages: list[Message], started: str) -> CallRecord:
    return CallRecord(messages=messages, started_at=started)


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

    def conductor_messages(
        self, question: str, max_steps: int, previous: PreviousRound | None = None
    ) -> list[Message]:
        """The messages that ask the Conductor for a round's workflow, as they are sent
        (the first round's without ``previous``); also what a spend estimate counts the
        Conductor's call by, before anything is asked."""
        cond = self.conductor
        messages = build_conductor_messages(
            question,
            self.pool.workers,
            max_steps=max_steps,
            template=cond.template,
            show_descriptions=cond.show_descriptions,
            previous=previous,
            subtasks=cond.subtasks,
            cost_weight=cond.cost_weight,
        )
        return fit_prefill(messages, cond.target)

    def _grammar(self, allow_empty: bool, max_steps: int) -> str | None:
        if not self.conductor.constrained:
            return None
        key = (len(self.pool.workers), max_steps, allow_empty)
        if key not in self._grammar_cache:
            from .grammar import workflow_grammar
            from .llm.factory import capabilities_of
            from .llm.structured import carries_grammar

            target = self.conductor.target
            if not self._grammar_cache and not carries_grammar(
                target, capabilities_of(target).grammar
            ):
                # Said once per run: the pool asked for constrained decoding and would
                # otherwise believe it has it.
                log.warning(
                    "the Conductor's client (%s, model %r%s) sends no grammar, so "
                    "`constrained: true` does not constrain its replies; the workflow "
                    "parser still checks them",
                    target.client or "litellm",
                    target.model,
                    ", structured_outputs: none"
                    if target.structured_outputs == "none"
                    else ("" if target.api_base else ", no api_base"),
                )

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
        messages = self.conductor_messages(question, max_steps, previous)
        prefill = conductor_prefill(messages)

        def parse(sent: list[Message], reply: str) -> Workflow:
            """The workflow of ``reply`` to ``sent`` (its prefill put back in front)."""
            return parse_workflow(
                join_prefill(sent, reply),
                n_workers=len(self.pool.workers),
                max_steps=max_steps,
                allow_empty=allow_empty,
                subtask_choices=cond.subtasks,
            )

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
                return parse(messages, given)
            except WorkflowParseError as exc:
                rnd.parse_errors.append(exc.reason)
                rnd.stop_reason = f"the given Conductor reply could not be parsed: {exc.reason}"
                return None
        if prefill is not None:
            self.conductor.check_prefill()
        grammar = self._grammar(allow_empty, max_steps)
        caller = self.callers.get(cond.target)
        for attempt in range(cond.parse_retries + 1):
            refusal = await budget.hold([cond.target])
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
                workflow = parse(messages, completion.text)
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
        self, question: str, workflow: Workflow, rnd: RoundRecord, runner: StepRunner
    ) -> None:
        plans = [
            StepPlan(
                worker=step.worker,
                subtask=step.subtask,
                visible=step.visible(i),
                access=(ALL,) if step.access == ALL else tuple(step.access),
                sees_history=step.access == ALL,
            )
            for i, step in enumerate(workflow.steps)
        ]

        def compose(i: int, context: list[SharedStep]) -> list[Message]:
            step = workflow.steps[i]
            return self.worker_messages(question, step.worker, step.subtask, context)

        await runner.run_round(rnd, plans, compose)

    def worker_messages(
        self, question: str, worker: int, subtask: str, context: list[SharedStep]
    ) -> list[Message]:
        """The messages a step of worker ``worker`` (its index in the pool) is sent: the
        question, the earlier steps it sees (``context``), its subtask, in the form and
        with the prefill its ``context:`` settings ask for."""
        target = self.pool.workers[worker]
        return build_worker_messages(
            question,
            context,
            subtask,
            keep_reasoning=target.context.reasoning == "keep",
            prefill=self._prefills.get(target.id),
            form=target.context.message,
        )

    # -- one question --------------------------------------------------------------

    async def run(
        self,
        question: str,
        settings: RunSettings | None = None,
        *,
        events: EventSink | None = None,
        sample_id: str | None = None,
        epoch: int | None = None,
        plan: str | None = None,
        continue_from: RunRecord | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
        budget: Budget | None = None,
        answer_format: AnswerFormat = PLAIN,
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
        ``budget`` replaces the one ``settings`` would give (see
        :meth:`~conductor.strategies.Strategy.run`).
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
        )
        if not answer_format.plain:
            record.answer_format = answer_format.describe()
        runner = StepRunner(
            self.pool.workers,
            self.callers,
            budget=budget
            if budget is not None
            else Budget(max_calls=settings.max_calls, max_usd=settings.budget_usd),
            sample_index=settings.sample_index,
            emit=emit,
            answer_format=answer_format,
        )
        previous: PreviousRound | None = None
        answer: str | None = None
        start = 0
        if continue_from is not None:
            runner.remember(continue_from)
            previous, answer = _continue(record, continue_from)
            start = len(record.rounds)
            if previous is not None:
                previous = replace(previous, reply=last_plan_reply(continue_from))
        if on_record is not None:
            on_record(record)
        rounds = self._rounds(question, record, runner, previous, answer, start, settings, plan)
        return await run_to_record(record, rounds, emit)

    async def _rounds(
        self,
        question: str,
        record: RunRecord,
        runner: StepRunner,
        previous: PreviousRound | None,
        answer: str | None,
        start: int,
        settings: RunSettings,
        plan: str | None,
    ) -> None:
        """Run the Conductor rounds of ``record``, filling it in (final answer included)."""
        budget, emit = runner.budget, runner.emit
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
            await self._run_steps(question, workflow, rnd, runner)
            round_answer = _round_answer(rnd, len(workflow.steps), runner.answer_format.plain)
            last = rnd.steps[-1] if rnd.steps else None
            calls = last.call.tool_calls if last is not None and round_answer is not None else None
            if calls:
                # The answer asks the caller to run tools: nothing more can be done before
                # their results come back (in the caller's next question).
                answer = rnd.final_answer = round_answer or None
                rnd.final_tool_calls = record.final_tool_calls = calls
                rnd.stop_reason = "the answer calls tools"
                emit(Event("round_finished", r, detail=rnd.stop_reason))
                break
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


def _round_answer(rnd: RoundRecord, n_steps: int, plain: bool) -> str | None:
    """The answer of a round of ``n_steps`` steps: its last step's that gave one, or,
    when the run asks for an answer format, its last step's alone (the one step that
    was given the format; ``""`` for a reply that only calls tools)."""
    if plain:
        return next((s.answer for s in reversed(rnd.steps) if s.status == "ok" and s.answer), None)
    last = rnd.steps[-1] if rnd.steps else None
    if last is None or last.index != n_steps - 1 or last.status != "ok":
        return None
    return last.answer if (last.answer or last.call.tool_calls) else None


def _continue(record: RunRecord, earlier: RunRecord) -> tuple[PreviousRound | None, str | None]:
    """Seed ``record`` with the rounds of ``earlier``; return what the next round sees."""
    from .workflow import workflow_from_dict

    record.rounds = list(earlier.rounds)
    plans = [workflow_from_dict(rnd.workflow) for rnd in earlier.rounds if rnd.workflow]
    if not plans or earlier.final_answer is None:
        return None, earlier.final_answer
    return PreviousRound(format_workflow(plans[-1]), earlier.final_answer), earlier.final_answer


def _plan_reply(rnd: RoundRecord) -> str | None:
    """The Conductor's whole reply (prefill included) that gave round ``rnd`` its plan:
    the last of its tries, the one that parsed."""
    return rnd.conductor_calls[-1].reply if rnd.conductor_calls else None


def last_plan_reply(record: RunRecord) -> str | None:
    """The reply that wrote ``record``'s last plan (what a revision round continues)."""
    last = next((rnd for rnd in reversed(record.rounds) if rnd.workflow), None)
    return _plan_reply(last) if last is not None else None


async def ask(
    question: str,
    pool: Pool,
    conductor: Conductor,
    settings: RunSettings | None = None,
    *,
    cache: ResponseCache | None = None,
    events: EventSink | None = None,
    on_record: Callable[[RunRecord], None] | None = None,
    answer_format: AnswerFormat = PLAIN,
) -> RunRecord:
    """Run one question and close the clients afterwards (``on_record`` and ``answer_format``
    as for :meth:`Orchestrator.run`)."""
    async with Orchestrator(pool, conductor, cache=cache) as orch:
        return await orch.run(
            question, settings, events=events, on_record=on_record, answer_format=answer_format
        )
