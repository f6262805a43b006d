"""The baselines the Conductor is compared to: plans fixed in advance, spelled as
``--strategy`` (and ``serve``'s model ids) name them.

- ``single:WORKER``: one call to one worker with the plain prompt.
- ``vote:K:WORKER``: K independent samples from one worker, majority over the answers
  the benchmark's grader extracts (self-consistency); ties go to the earliest answer.
- ``moa`` / ``moa:AGGREGATOR``: every pool worker answers independently, then one
  aggregator (the first worker unless named) sees all answers and writes the final one,
  as the paper's Mixture-of-Agents baseline (one proposer layer and an aggregator).
- ``reflect:K:WORKER``: one answer, then K rounds in which the worker reviews its latest
  answer and writes an improved one.

The baselines run their steps with the executor's :class:`~conductor.steps.StepRunner`,
so they stop calling where a budget (``--max-calls``, ``--budget-usd``) refuses,
recording the refused steps as the Conductor's runs do, and emit the same progress
events.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..context import SharedStep, build_worker_messages
from ..errors import UsageError
from ..events import Event, EventSink, null_sink
from ..execute import RunSettings
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.caller import CallerSet
from ..llm.types import Message
from ..pool import Pool, pool_to_public_dict
from ..record import RoundRecord, RunRecord
from ..steps import Budget, Compose, StepPlan, StepRunner, run_to_record
from ..targets import Worker
from ..workflow import Step, Workflow, workflow_to_dict
from .answers import AnswerKey
from .base import CallPlan, EarlierReplies, PlannedCall, PlannedShare

__all__ = ["MOA_INSTRUCTION", "REFLECT_INSTRUCTION", "FixedStrategy", "parse_strategy"]

#: What the aggregator of the Mixture-of-Agents baseline is asked to do.
MOA_INSTRUCTION = (
    "Several models answered the task independently; their answers are shown above. "
    "Judge them critically (they may be wrong, and the majority may be wrong too), then "
    "write one final answer of the highest quality, in the exact format the task asks for."
)
#: What each self-reflection round asks of the worker.
REFLECT_INSTRUCTION = (
    "Above is your latest answer to the task. Check it carefully for mistakes in "
    "reasoning, calculation or format. Then write an improved, complete final answer, in "
    "the exact format the task asks for (repeat the answer if it was already right)."
)

#: The subtask a plan step that gets the plain prompt shows in its record.
_AS_GIVEN = "(the task as given)"


@dataclass(frozen=True)
class _Planned:
    """A step of a fixed plan: who answers, seeing which earlier steps, told what.

    ``subtask`` is ``None`` for a step that gets the plain prompt and nothing else.
    """

    worker: int
    visible: tuple[int, ...] = ()
    subtask: str | None = None


class FixedStrategy:
    """A baseline with a plan fixed in advance (no Conductor call).

    Of ``settings`` only the budgets apply (``max_calls``, ``budget_usd``, per question):
    steps and rounds are the Conductor's.
    """

    def __init__(
        self,
        name: str,
        pool: Pool,
        plan: list[_Planned],
        callers: CallerSet,
        *,
        vote_key: AnswerKey | None = None,
        settings: RunSettings | None = None,
    ) -> None:
        self.name = name
        self.pool = pool
        self.plan = plan
        self.callers = callers
        self.vote_key = vote_key
        self.max_calls = settings.max_calls if settings is not None else None
        self.budget_usd = settings.budget_usd if settings is not None else None
        self._pool_dict = pool_to_public_dict(pool)
        self._steps = [
            StepPlan(s.worker, s.subtask or _AS_GIVEN, s.visible, s.visible) for s in plan
        ]
        self._workflow = Workflow(
            tuple(Step(s.worker, s.subtask or _AS_GIVEN, s.visible) for s in plan)
        )

    @property
    def workflow(self) -> Workflow:
        """The plan as its records show it: each step's worker, instruction and the
        earlier steps it sees."""
        return self._workflow

    @property
    def targets(self) -> tuple[Worker, ...]:
        return tuple(self.pool.workers[step.worker] for step in self.plan)

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        # Each worker of the plan, as often at once as the first wave of steps (those
        # that see no earlier step) calls it.
        first = Counter(step.worker for step in self.plan if not step.visible)
        used = dict.fromkeys(step.worker for step in self.plan)
        return tuple((self.pool.workers[i], first.get(i, 1)) for i in used)

    @property
    def call_roles(self) -> tuple[tuple[str, Worker], ...]:
        return tuple((t.id, t) for t in self.targets)

    def planned_calls(self, question: str, *, workflow_steps: int) -> CallPlan:
        # The plan is fixed: each step's request as built, shown the earlier answers
        # its step sees (not written yet, so counted apart).
        workers = self.pool.workers
        steps = self._workflow.steps
        calls = []
        for i, step in enumerate(steps):
            seen = step.visible(i)
            shared = [SharedStep(f"0.{j}", steps[j].worker, steps[j].subtask, "") for j in seen]
            worker = workers[step.worker]
            share = PlannedShare(
                worker.id, worker, 1.0, self.step_messages(question, i, shared),
                "the plan's {calls}, its requests as built",
                replies=tuple(EarlierReplies(1, (workers[steps[j].worker],)) for j in seen),
            )  # fmt: skip
            calls.append(PlannedCall((share,)))
        return CallPlan(tuple(calls))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.name,
            "workflow": workflow_to_dict(self._workflow),
            "votes": self.vote_key is not None,
        }
        # Only when set, so that a run without budgets resumes (and replays its cached
        # samples) as the runs made before baselines had budgets.
        if self.max_calls is not None or self.budget_usd is not None:
            out["settings"] = {"budget_usd": self.budget_usd, "max_calls": self.max_calls}
        return out

    def answer_refusal(self, answer: AnswerFormat) -> str | None:
        if answer.plain:
            return None
        if self.vote_key is not None:
            # A majority is taken over the answers' short keys: tool calls and JSON
            # documents have none to count.
            return f"{self.name} cannot answer with tools or a JSON response_format: use single:W"
        return answer.refusal(self.pool.workers[self.plan[-1].worker])

    def step_messages(self, question: str, i: int, visible: list[SharedStep]) -> list[Message]:
        """The messages step ``i`` of the plan is sent, seeing the earlier steps
        ``visible``: the plain prompt, or the question with those steps and the step's
        instruction (also what :meth:`planned_calls` builds, before any call is made)."""
        step = self.plan[i]
        if step.subtask is None:
            return [{"role": "user", "content": question}]
        return build_worker_messages(question, visible, step.subtask)

    def _compose(self, question: str) -> Compose:
        def compose(i: int, visible: list[SharedStep]) -> list[Message]:
            return self.step_messages(question, i, visible)

        return compose

    async def run(
        self,
        question: str,
        *,
        sample_index: int,
        sample_id: str | None = None,
        epoch: int | None = None,
        events: EventSink | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
        budget: Budget | None = None,
        answer_format: AnswerFormat = PLAIN,
    ) -> RunRecord:
        refused = self.answer_refusal(answer_format)
        if refused is not None:
            raise UsageError(refused)
        emit = events or null_sink
        record = RunRecord(
            question=question,
            pool=self._pool_dict,
            conductor={"backend": "strategy", "strategy": self.name},
            settings={"sample_index": sample_index, "strategy": self.name},
            sample_id=sample_id,
            epoch=epoch,
        )
        if not answer_format.plain:
            record.answer_format = answer_format.describe()
        rnd = RoundRecord(index=0, workflow=workflow_to_dict(self._workflow))
        record.rounds.append(rnd)
        if on_record is not None:
            on_record(record)
        runner = StepRunner(
            self.pool.workers,
            self.callers,
            budget=budget
            if budget is not None
            else Budget(max_calls=self.max_calls, max_usd=self.budget_usd),
            sample_index=sample_index,
            emit=emit,
            answer_format=answer_format,
        )

        async def steps() -> None:
            await runner.run_round(rnd, self._steps, self._compose(question))
            answers = [s.answer if s.status == "ok" else None for s in rnd.steps]
            if self.vote_key is not None:
                record.final_answer, record.votes = _majority(answers, self.vote_key)
            elif answer_format.plain:
                record.final_answer = next((a for a in reversed(answers) if a), None)
            else:
                # Only the last step was given the format: its answer alone will do.
                last = rnd.steps[-1] if len(rnd.steps) == len(self.plan) else None
                if last is not None and last.status == "ok":
                    record.final_answer = last.answer or None
                    record.final_tool_calls = rnd.final_tool_calls = last.call.tool_calls
            rnd.final_answer = record.final_answer
            emit(Event("round_finished", 0))

        return await run_to_record(record, steps(), emit)

    async def aclose(self) -> None:
        await self.callers.aclose()


def _majority(answers: list[str | None], key: AnswerKey) -> tuple[str | None, dict[str, int]]:
    """The answer whose key is most common (earliest wins a tie), and the tally."""
    keys = [key(a) if a else None for a in answers]
    tally = Counter(k for k in keys if k is not None)
    if not tally:
        return next((a for a in answers if a), None), {}
    best = max(tally.values())
    winner = next(k for k in keys if k is not None and tally[k] == best)
    return answers[keys.index(winner)], dict(tally)


_STRATEGY = re.compile(r"^(single|vote|moa|reflect)(?::(.*))?$")


def _worker_index(pool: Pool, worker_id: str, strategy: str) -> int:
    for i, w in enumerate(pool.workers):
        if w.id == worker_id:
            return i
    ids = ", ".join(w.id for w in pool.workers)
    raise UsageError(
        f"--strategy {strategy}: no worker {worker_id!r} in pool {pool.name!r} ({ids})"
    )


#: The most digits a K is read with when no ``max_k`` is given: int() of a long digit
#: string is slow (and refused past 4,300 digits), and no plan that size could run.
_K_DIGITS = 9


def _count(text: str, strategy: str, max_k: int | None) -> int:
    # ASCII only: str.isdigit also admits digits int() does not read (superscripts).
    digits = text.lstrip("0") if text.isascii() and text.isdigit() else ""
    if not digits:
        raise UsageError(f"--strategy {strategy}: K must be a positive integer, got {text!r}")
    limit = max_k if max_k is not None else 10**_K_DIGITS - 1
    if len(digits) > len(str(limit)) or int(digits) > limit:
        shown = text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"
        raise UsageError(f"--strategy {strategy}: K must be at most {limit:,}, got {shown}")
    return int(digits)


def parse_strategy(
    text: str,
    pool: Pool,
    callers: CallerSet,
    *,
    vote_key: AnswerKey | None = None,
    settings: RunSettings | None = None,
    max_k: int | None = None,
) -> FixedStrategy:
    """A baseline from its name: ``single:W``, ``vote:K:W``, ``moa[:W]``, ``reflect:K:W``.

    ``settings`` gives its per-question budgets (see :class:`FixedStrategy`).  ``max_k``
    bounds K; it is checked on the text, before anything is built, so a name from a
    client (``serve``) cannot make a plan of any size."""
    m = _STRATEGY.match(text.strip())
    if not m:
        raise UsageError(
            f"--strategy {text!r} is not understood: use conductor, single:WORKER, "
            "vote:K:WORKER, moa, moa:AGGREGATOR, reflect:K:WORKER or singles"
        )
    kind, rest = m.group(1), m.group(2) or ""
    if kind == "single":
        plan = [_Planned(_worker_index(pool, rest, text))]
        return FixedStrategy(text, pool, plan, callers, settings=settings)
    if kind == "moa":
        agg = _worker_index(pool, rest, text) if rest else 0
        proposers = [_Planned(i) for i in range(len(pool.workers))]
        final = _Planned(agg, tuple(range(len(proposers))), MOA_INSTRUCTION)
        return FixedStrategy(text, pool, [*proposers, final], callers, settings=settings)
    k_text, _, worker_id = rest.partition(":")
    if not worker_id:
        raise UsageError(f"--strategy {text!r} needs K and a worker: {kind}:K:WORKER")
    k, w = _count(k_text, text, max_k), _worker_index(pool, worker_id, text)
    if kind == "vote":
        if vote_key is None:
            raise UsageError(f"--strategy {text}: voting needs a benchmark grader to read answers")
        votes = [_Planned(w) for _ in range(k)]
        return FixedStrategy(text, pool, votes, callers, vote_key=vote_key, settings=settings)
    plan = [_Planned(w)] + [_Planned(w, (i,), REFLECT_INSTRUCTION) for i in range(k)]
    return FixedStrategy(text, pool, plan, callers, settings=settings)
