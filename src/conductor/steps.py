"""The body of a step, once: what the Conductor's workflows and the baselines share.

A :class:`StepRunner` runs the steps of one question (one run), round by round.  Each
step starts as soon as every step it can see has finished, so steps that see nothing
run at the same time.  For each step it checks the budget (a refused step is recorded
``skipped``, with the reason, and is never sent), takes the request's sample index,
makes the call, fills the :class:`~conductor.record.StepRecord` and its
:class:`~conductor.record.CallRecord`, emits ``step_started`` / ``step_finished``
events, and keeps the answer as a :class:`~conductor.context.SharedStep` for the steps
(and rounds) that may see it.  What a step is sent is its caller's: the Conductor's
workflows follow each worker's ``context:`` settings, the baselines send the plain
prompt (:data:`Compose`).

Interruption: a round's record keeps the steps started so far when it is cancelled,
and :func:`finish_interrupted` marks the calls still in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

from .context import SharedStep
from .errors import ModelCallError, UsageError
from .events import Event, EventSink, null_sink
from .llm.answer_format import ANSWER_RETRIES, PLAIN, AnswerFormat
from .llm.caller import CallerSet
from .llm.cost import failed_call_cost
from .llm.prefill_rules import join_prefill
from .llm.types import Completion, Message, ModelRequest
from .record import CallRecord, RoundRecord, RunRecord, StepRecord, Totals, now_iso
from .targets import Worker
from .text import plural, strip_think

__all__ = [
    "INTERRUPTED",
    "Budget",
    "Compose",
    "PlanHold",
    "SampleIndexer",
    "StepPlan",
    "StepRunner",
    "fail_call",
    "fill_call",
    "finish_interrupted",
    "finish_record",
    "run_to_record",
]


class PlanHold(Protocol):
    """Where the calls a plan may make are held before the first of them is made (a
    ``serve`` key's budget, shared by every request of the key: see
    :mod:`conductor.serve`)."""

    async def hold(self, calls: Sequence[Worker], most: int | None) -> str | None:
        """Hold the worst case of ``calls`` (the target of each call the plan may make,
        a call that may be asked again counted once per try), of which no more than
        ``most`` can be made (``None``: all); the reason it cannot be held (then none of
        them may be made), or ``None`` when it is."""
        ...


@dataclass
class Budget:
    """Running spend of one question against its limits.

    With a :attr:`holder`, the calls of each plan (a round's steps, a Conductor try) are
    held there first (:meth:`hold`); once a hold is refused, no further call of the
    budget starts (:attr:`held_back`).
    """

    max_calls: int | None = None
    max_usd: float | None = None
    calls: int = 0
    usd: float = 0.0
    #: The first refusal given: a call the budget stopped (``None``: none yet).
    stopped: str | None = None
    holder: PlanHold | None = None
    #: Why the holder refused a plan (``None``: it never did).
    held_back: str | None = None

    async def hold(self, calls: Sequence[Worker]) -> str | None:
        """Hold ``calls`` (see :class:`PlanHold`) before the first is made: the refusal
        (kept, so every later call is refused too), or ``None`` when they may go."""
        if self.refusal() is None and self.holder is not None and calls:
            # No more calls can be made than the budget has left, whichever they are.
            most = None if self.max_calls is None else self.max_calls - self.calls
            self.held_back = await self.holder.hold(calls, most)
        return self.refusal()

    def refusal(self) -> str | None:
        """Why one more call may not start, or ``None`` if it may.  Callers ask just
        before a call and skip it on a refusal, so the first one is kept in
        :attr:`stopped`."""
        reason = self.held_back
        if reason is None and self.max_calls is not None and self.calls >= self.max_calls:
            reason = f"call budget reached ({plural(self.max_calls, 'call')})"
        elif reason is None and self.max_usd is not None and self.usd >= self.max_usd:
            reason = f"USD budget reached (${self.usd:.4f} of ${self.max_usd:.4f})"
        if reason is not None and self.stopped is None:
            self.stopped = reason
        return reason

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


def fill_call(call: CallRecord, completion: Completion) -> None:
    """Record a call that returned ``completion``."""
    call.response = completion.text
    call.input_tokens = completion.usage.input_tokens
    call.output_tokens = completion.usage.output_tokens
    call.cost_usd = completion.cost_usd
    call.cost_reported = completion.cost_reported
    call.batch = completion.batch
    call.live_cost_usd = completion.live_cost_usd
    call.latency_s = round(completion.latency_s, 6)
    call.queue_s = round(completion.queue_s, 6)
    call.cached = completion.cached
    call.attempts = completion.attempts
    call.raw = completion.raw
    call.finish_reason = completion.finish_reason
    call.truncated = completion.truncated
    call.tool_calls = [asdict(c) for c in completion.tool_calls] or None
    call.retries = [dict(r) for r in completion.retries]
    call.finished_at = now_iso()


def fail_call(call: CallRecord, exc: ModelCallError, latency_s: float, target: Worker) -> None:
    """Record a call that still failed after its retries."""
    call.error = exc.describe()
    call.cost_usd = failed_call_cost(target)
    call.error_kind = type(exc).__name__
    call.attempts = exc.attempts or 1  # None: it failed before the retry layer counted
    call.retries = [dict(r) for r in exc.retries]
    call.latency_s = round(latency_s, 6)
    call.finished_at = now_iso()


@dataclass(frozen=True)
class StepPlan:
    """One step of a round as its record shows it.

    ``worker`` is the worker's index in the pool; ``visible`` the earlier steps of this
    round that it waits for and sees; ``sees_history`` whether it also sees every step
    of the run's earlier rounds (the Conductor's ``"all"``); ``access`` its access list
    as recorded.  ``subtask`` is what the record and later steps show as its subtask.
    """

    worker: int
    subtask: str
    visible: tuple[int, ...]
    access: tuple[Any, ...]
    sees_history: bool = False


#: The messages for step ``i`` of a round, given the earlier steps it sees.
Compose = Callable[[int, list[SharedStep]], list[Message]]


class StepRunner:
    """Runs the steps of one question's rounds against a pool's workers.

    One runner belongs to one run: it holds the run's budget (which the Conductor's own
    calls draw on too), its sample indices and the steps of the rounds finished so far.
    """

    def __init__(
        self,
        workers: Sequence[Worker],
        callers: CallerSet,
        *,
        budget: Budget,
        sample_index: int,
        emit: EventSink = null_sink,
        answer_format: AnswerFormat = PLAIN,
    ) -> None:
        self.workers = workers
        #: The form the run's answer must take, given to each round's last step.
        self.answer_format = answer_format
        self.callers = callers
        self.budget = budget
        self.samples = SampleIndexer(sample_index)
        self.emit = emit
        #: The steps of finished rounds, as later ``sees_history`` steps see them.
        self.history: list[SharedStep] = []

    def remember(self, record: RunRecord) -> None:
        """Take in the rounds of an earlier record of this question, as if this runner
        had run them: their steps are history, their requests keep their indices."""
        for rnd in record.rounds:
            for s in rnd.steps:
                ok = s.status == "ok"
                answer = s.answer if ok else None
                reasoned = None
                if ok and s.call.response is not None:
                    reasoned = join_prefill(s.call.messages, s.call.response).strip()
                self.history.append(
                    SharedStep(
                        f"{rnd.index}.{s.index}", s.worker_index, s.subtask, answer, reasoned
                    )
                )
                if s.status != "skipped":
                    # Requests already made keep their indices: a repeat is a new sample.
                    self.samples.next(s.worker_id, s.call.messages)

    async def run_round(
        self, rnd: RoundRecord, plans: Sequence[StepPlan], compose: Compose
    ) -> None:
        """Run ``plans`` as the steps of ``rnd``, filling ``rnd.steps`` (in order).

        Also when cancelled, the record keeps the steps started so far and the history
        the steps finished.
        """
        n = len(plans)
        # The round's calls are held before the first starts; refused, every step is
        # recorded skipped with the reason (the budget refuses each).
        await self.budget.hold(self._round_calls(plans))
        done = [asyncio.Event() for _ in range(n)]
        shared: list[SharedStep | None] = [None] * n
        records: list[StepRecord | None] = [None] * n

        async def one(i: int) -> None:
            plan = plans[i]
            try:
                for j in plan.visible:
                    await done[j].wait()
                # A skipped step gave nothing to see.
                context = [s for s in (shared[j] for j in plan.visible) if s is not None]
                if plan.sees_history:
                    context = [*self.history, *context]
                shared[i] = await self._step(
                    rnd.index, i, plan, compose(i, context), records, i == n - 1
                )
            finally:
                done[i].set()

        try:
            await asyncio.gather(*(one(i) for i in range(n)))
        finally:
            rnd.steps = [r for r in records if r is not None]
            self.history.extend(s for s in shared if s is not None)

    def _round_calls(self, plans: Sequence[StepPlan]) -> list[Worker]:
        """The target of every call ``plans`` may make: one a step, and each try of the
        last one when the run's answer format may ask it again."""
        calls = [self.workers[plan.worker] for plan in plans]
        if calls and not self.answer_format.plain:
            calls += [calls[-1]] * ANSWER_RETRIES
        return calls

    async def _step(
        self,
        round_index: int,
        i: int,
        plan: StepPlan,
        messages: list[Message],
        records: list[StepRecord | None],
        answering: bool,
    ) -> SharedStep | None:
        """The body of step ``i``: its record goes into ``records[i]`` before the call
        (so a cancelled call is still recorded); returns what later steps see of it
        (``None`` when it was not sent).  The ``answering`` step gets the run's answer
        format, and is asked again when its reply breaks it."""
        worker = self.workers[plan.worker]
        fmt = self.answer_format if answering else PLAIN
        refused = fmt.refusal(worker) if not fmt.plain else None
        if refused is not None:
            raise UsageError(f"{refused}: the run's answer format needs it")
        call = CallRecord(messages=messages, started_at=now_iso())
        rec = StepRecord(
            index=i,
            worker_index=plan.worker,
            worker_id=worker.id,
            model=worker.model,
            subtask=plan.subtask,
            access=list(plan.access),
            visible_steps=list(plan.visible),
            call=call,
        )
        records[i] = rec
        label = f"{round_index}.{i}"
        # A reply that could not be checked could not be the answer: not asked for.
        refusal = self.budget.refusal() or fmt.check_refusal()
        if refusal is not None:
            rec.status = "skipped"
            call.error = refusal
            call.error_kind = "BudgetExceeded"
            call.cost_usd = 0.0  # never sent
            return None
        self.emit(Event("step_started", round_index, step=i, worker_id=worker.id))
        for attempt in range(ANSWER_RETRIES + 1):
            if attempt:
                rec.rejected.append(call)
                call = rec.call = CallRecord(messages=messages, started_at=now_iso())
            self.budget.calls += 1
            request = ModelRequest(
                messages=tuple(messages),
                params=worker.params,
                sample_index=self.samples.next(worker.id, messages),
            )
            t0 = time.perf_counter()
            try:
                completion = await self.callers.get(worker).complete(fmt.apply(request))
            except ModelCallError as exc:
                fail_call(call, exc.with_target(worker.id), time.perf_counter() - t0, worker)
                return self._failed(rec, round_index, label, plan)
            fill_call(call, completion)
            self.budget.charge(completion.cost_usd)
            # The call records what the provider returned; the answer is the reply as the
            # worker wrote it, its prefill included.
            reply = join_prefill(messages, completion.text)
            rec.answer = strip_think(reply).strip()
            violation = await fmt.check(rec.answer, completion.tool_calls)
            if violation is None:
                break
            call.error_kind = "AnswerFormatError"
            call.error = f"the reply breaks the requested answer format: {violation}"
            refusal = self.budget.refusal() or fmt.check_refusal()
            if attempt == ANSWER_RETRIES or refusal is not None:
                tries = plural(attempt + 1, "try", "tries")
                call.error = (
                    f"the reply broke the requested answer format after {tries}: {violation}"
                    + (f" ({refusal})" if refusal is not None and attempt < ANSWER_RETRIES else "")
                )
                rec.answer = None
                return self._failed(rec, round_index, label, plan)
        self.emit(
            Event(
                "step_finished",
                round_index,
                step=i,
                worker_id=worker.id,
                cached=completion.cached,
                latency_s=completion.latency_s,
            )
        )
        return SharedStep(label, plan.worker, plan.subtask, rec.answer, reply.strip())

    def _failed(self, rec: StepRecord, round_index: int, label: str, plan: StepPlan) -> SharedStep:
        """Mark ``rec`` failed (its call's error says why) and tell the listeners."""
        rec.status = "failed"
        self.emit(
            Event(
                "step_finished",
                round_index,
                step=rec.index,
                worker_id=rec.worker_id,
                failed=True,
                detail=rec.call.error,
            )
        )
        return SharedStep(label, plan.worker, plan.subtask, None)


async def run_to_record(
    record: RunRecord, work: Awaitable[None], emit: EventSink = null_sink
) -> RunRecord:
    """Await ``work`` (which fills ``record``'s rounds and final answer), then finish
    ``record``: totals, status, error, and the ``run_finished`` event.  A cancelled run's
    record is finished as interrupted (:func:`finish_interrupted`) before the
    cancellation goes on."""
    t0 = time.perf_counter()
    try:
        await work
    except asyncio.CancelledError:
        finish_interrupted(record, time.perf_counter() - t0)
        raise
    finish_record(record, time.perf_counter() - t0)
    emit(Event("run_finished", len(record.rounds) - 1, failed=record.status == "failed"))
    return record


def _span(start: float, end: float) -> list[tuple[float, float]]:
    return [(start, end)] if end > start else []


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def waiting_s(calls: Iterable[CallRecord]) -> float:
    """Seconds in which one of ``calls`` waited (its ``queue_s``) while none of them was
    being answered (its ``latency_s``), each call placed by its ``finished_at``."""
    waits: list[tuple[float, float]] = []
    work: list[tuple[float, float]] = []
    for call in calls:
        if not call.finished_at:
            continue
        end = datetime.fromisoformat(call.finished_at).timestamp()
        answered = end - call.latency_s
        work += _span(answered, end)
        waits += _span(answered - call.queue_s, answered)
    total = 0.0
    busy = _union(work)
    for start, end in _union(waits):
        total += end - start
        for b_start, b_end in busy:
            total -= max(0.0, min(end, b_end) - max(start, b_start))
    return max(0.0, total)


def finish_record(record: RunRecord, wall_s: float) -> None:
    """Fill in ``record``'s totals, status and error from its calls and steps."""
    totals = Totals(wall_s=round(wall_s, 6))
    cost = 0.0
    live: float | None = 0.0
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
        if call.batch:
            totals.batch_calls += 1
            live = None if live is None or call.live_cost_usd is None else live + call.live_cost_usd
        elif live is not None:
            live += call.cost_usd or 0.0
    totals.cost_usd = round(cost, 8)
    if totals.batch_calls and live is not None:
        totals.live_cost_usd = round(live, 8)
    totals.queue_s = round(min(waiting_s(record.all_calls()), totals.wall_s), 6)
    record.totals = totals
    record.finished_at = now_iso()
    failed_steps = [s for rnd in record.rounds for s in rnd.steps if s.status != "ok"]
    if not record.answered:
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
    record.status = "partial" if record.answered else "failed"
    record.error = f"the run was {INTERRUPTED}"


def _interrupt(call: CallRecord) -> bool:
    """Mark ``call`` interrupted if it was still waiting for its reply."""
    if call.response is not None or call.error is not None:
        return False
    call.error = INTERRUPTED
    call.error_kind = "Interrupted"
    call.finished_at = now_iso()
    return True
