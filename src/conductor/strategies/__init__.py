"""Ways to answer a benchmark question: the Conductor, and the baselines it is compared to.

- ``conductor``: the Conductor writes a workflow per question (the executor runs it).
- ``single:WORKER``: one call to one worker with the plain prompt.
- ``vote:K:WORKER``: K independent samples from one worker, majority over the answers
  the benchmark's grader extracts (self-consistency); ties go to the earliest answer.
- ``moa`` / ``moa:AGGREGATOR``: every pool worker answers independently, then one
  aggregator (the first worker unless named) sees all answers and writes the final one,
  as the paper's Mixture-of-Agents baseline (one proposer layer and an aggregator).
- ``reflect:K:WORKER``: one answer, then K rounds in which the worker reviews its latest
  answer and writes an improved one.

Every strategy returns a :class:`~conductor.record.RunRecord` of the same shape, so
``trace`` and ``report`` treat baselines and Conductor runs alike.  The baselines run
their steps with the executor's :class:`~conductor.steps.StepRunner`, so they stop
calling where a budget (``--max-calls``, ``--budget-usd``) refuses, recording the
refused steps as the Conductor's runs do, and emit the same progress events.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..conductors.spec import Conductor
from ..context import SharedStep, build_worker_messages
from ..errors import UsageError, target_name
from ..events import Event, EventSink, null_sink
from ..execute import Orchestrator, RunSettings
from ..llm.caller import CallerSet
from ..llm.limiter import SampleCapacity, SampleShare, sample_capacity
from ..llm.types import Message
from ..pool import Pool, pool_to_public_dict
from ..record import RoundRecord, RunRecord
from ..shipped import is_shipped
from ..steps import Budget, Compose, StepPlan, StepRunner, run_to_record
from ..targets import Worker
from ..text import plural, targets_named

__all__ = [
    "DEFAULT_CONCURRENCY",
    "MOA_INSTRUCTION",
    "REFLECT_INSTRUCTION",
    "answer_key_for",
    "AnswerKey",
    "concurrency_warning",
    "default_concurrency",
    "sample_capacity_of",
    "short_answer_key",
    "ConductorStrategy",
    "FixedStrategy",
    "Strategy",
    "parse_strategy",
]

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

#: Turns a response into the key that votes are counted on (``None`` = no answer).
AnswerKey = Callable[[str], "str | None"]


class Strategy(Protocol):
    """Something that answers one question and records how."""

    name: str

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for the run's config (no secrets)."""
        ...

    async def run(
        self,
        question: str,
        *,
        sample_index: int,
        sample_id: str | None = None,
        epoch: int | None = None,
        events: EventSink | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
    ) -> RunRecord:
        """Answer ``question``; ``on_record`` gets the record as soon as it exists (it
        fills in as the run goes: what an interrupted caller keeps)."""
        ...

    async def aclose(self) -> None: ...


class ConductorStrategy:
    """The Conductor writes a workflow for each question."""

    name = "conductor"

    def __init__(
        self, pool: Pool, conductor: Conductor, settings: RunSettings, callers: CallerSet
    ) -> None:
        self.settings = settings
        self.orchestrator = Orchestrator(pool, conductor, callers=callers)

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "strategy": self.name,
            "conductor": self.orchestrator.conductor.describe(),
            "settings": {
                "max_steps": s.max_steps,
                "rounds": s.rounds,
                "budget_usd": s.budget_usd,
                "max_calls": s.max_calls,
            },
        }

    async def run(
        self,
        question: str,
        *,
        sample_index: int,
        sample_id: str | None = None,
        epoch: int | None = None,
        events: EventSink | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
    ) -> RunRecord:
        settings = replace(self.settings, sample_index=sample_index)
        return await self.orchestrator.run(
            question,
            settings,
            events=events,
            sample_id=sample_id,
            epoch=epoch,
            on_record=on_record,
        )

    async def aclose(self) -> None:
        await self.orchestrator.aclose()


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

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.name,
            "workflow": _plan_dict(self.plan),
            "votes": self.vote_key is not None,
        }
        # Only when set, so that a run without budgets resumes (and replays its cached
        # samples) as the runs made before baselines had budgets.
        if self.max_calls is not None or self.budget_usd is not None:
            out["settings"] = {"budget_usd": self.budget_usd, "max_calls": self.max_calls}
        return out

    def _compose(self, question: str) -> Compose:
        def compose(i: int, visible: list[SharedStep]) -> list[Message]:
            step = self.plan[i]
            if step.subtask is None:
                return [{"role": "user", "content": question}]
            return build_worker_messages(question, visible, step.subtask)

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
    ) -> RunRecord:
        emit = events or null_sink
        record = RunRecord(
            question=question,
            pool=self._pool_dict,
            conductor={"backend": "strategy", "strategy": self.name},
            settings={"sample_index": sample_index, "strategy": self.name},
            sample_id=sample_id,
            epoch=epoch,
        )
        rnd = RoundRecord(index=0, workflow=_plan_dict(self.plan))
        record.rounds.append(rnd)
        if on_record is not None:
            on_record(record)
        runner = StepRunner(
            self.pool.workers,
            self.callers,
            budget=Budget(max_calls=self.max_calls, max_usd=self.budget_usd),
            sample_index=sample_index,
            emit=emit,
        )

        async def steps() -> None:
            await runner.run_round(rnd, self._steps, self._compose(question))
            answers = [s.answer if s.status == "ok" else None for s in rnd.steps]
            if self.vote_key is not None:
                record.final_answer, record.metadata["votes"] = _majority(answers, self.vote_key)
            else:
                record.final_answer = next((a for a in reversed(answers) if a), None)
            rnd.final_answer = record.final_answer
            emit(Event("round_finished", 0))

        return await run_to_record(record, steps(), emit)

    async def aclose(self) -> None:
        await self.callers.aclose()


def _plan_dict(plan: list[_Planned]) -> dict[str, Any]:
    return {
        "model_id": [s.worker for s in plan],
        "subtasks": [s.subtask or _AS_GIVEN for s in plan],
        "access_list": [list(s.visible) for s in plan],
    }


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


def _count(text: str, strategy: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--strategy {strategy}: K must be a positive integer, got {text!r}")
    return int(text)


def parse_strategy(
    text: str,
    pool: Pool,
    callers: CallerSet,
    *,
    vote_key: AnswerKey | None = None,
    settings: RunSettings | None = None,
) -> FixedStrategy:
    """A baseline from its name: ``single:W``, ``vote:K:W``, ``moa[:W]``, ``reflect:K:W``.

    ``settings`` gives its per-question budgets (see :class:`FixedStrategy`)."""
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
    k, w = _count(k_text, text), _worker_index(pool, worker_id, text)
    if kind == "vote":
        if vote_key is None:
            raise UsageError(f"--strategy {text}: voting needs a benchmark grader to read answers")
        votes = [_Planned(w) for _ in range(k)]
        return FixedStrategy(text, pool, votes, callers, vote_key=vote_key, settings=settings)
    plan = [_Planned(w)] + [_Planned(w, (i,), REFLECT_INSTRUCTION) for i in range(k)]
    return FixedStrategy(text, pool, plan, callers, settings=settings)


def short_answer_key(text: str) -> str | None:
    """What votes count for a question without a benchmark (``ask``, ``serve``): the
    short final answer each reply gives (``ANSWER: x``, a boxed answer, or a one-line
    reply), as ``short`` benchmarks read it."""
    return answer_key_for("short")(text)


def answer_key_for(grader: str) -> AnswerKey:
    """How votes are counted for a benchmark graded by ``grader``: the letter for
    multiple choice, a normalised final answer for math, the code text for code (exact
    matches only, so code votes rarely agree; a test-based vote is future work)."""
    if grader == "choice":
        from ..grading.extract import extract_letter

        return lambda text: extract_letter(text, 26)
    if grader == "math":
        from ..grading.extract import extract_math_answer
        from ..grading.math import normalise_answer

        def math_key(text: str) -> str | None:
            found = extract_math_answer(text)
            return normalise_answer(found) if found else None

        return math_key
    if grader == "short":
        from ..grading.short import final_answer, normalise_short

        def short_key(text: str) -> str | None:
            found = final_answer(text)
            return normalise_short(found) if found else None

        return short_key
    from ..grading.code_text import extract_code

    def code_key(text: str) -> str | None:
        code = extract_code(text)
        return code.strip() if code else None

    return code_key


#: Samples in flight when ``--concurrency`` is not given, at most: fewer where the
#: pool's models cannot serve as many at once (:func:`default_concurrency`).
DEFAULT_CONCURRENCY = 16


def sample_capacity_of(strategy: Strategy) -> SampleCapacity | None:
    """How many samples of ``strategy`` the pool's models can all serve at once (see
    :func:`~conductor.llm.limiter.sample_capacity`), or ``None`` for a strategy of
    unknown shape.

    The Conductor's samples may call the Conductor and any worker, one call each at a
    time as far as can be known before it plans; a fixed plan calls its workers, each
    as often at once as its first wave of steps does."""
    demand: list[tuple[Worker, int]]
    if isinstance(strategy, ConductorStrategy):
        orchestrator = strategy.orchestrator
        demand = [(orchestrator.conductor.target, 1), *((w, 1) for w in orchestrator.pool.workers)]
    elif isinstance(strategy, FixedStrategy):
        first = Counter(step.worker for step in strategy.plan if not step.visible)
        used = dict.fromkeys(step.worker for step in strategy.plan)
        demand = [(strategy.pool.workers[i], first.get(i, 1)) for i in used]
    else:
        return None
    return sample_capacity(demand)


def default_concurrency(strategy: Strategy) -> int:
    """Samples in flight when ``--concurrency`` is not given: as many as the pool's
    models can serve at once, at most :data:`DEFAULT_CONCURRENCY` (one, for a pool on
    one in-process model)."""
    capacity = sample_capacity_of(strategy)
    if capacity is None:
        return DEFAULT_CONCURRENCY
    return max(1, min(DEFAULT_CONCURRENCY, capacity.samples))


def concurrency_warning(strategy: Strategy, concurrency: int) -> str | None:
    """The sentence to show once when more than ``concurrency`` samples in flight are
    more than the pool's models can serve at once (the extra ones would only wait),
    saying what to change: ``--concurrency``, or ``max_concurrency`` in the user's own
    pool file (a copy of a shipped pool, never the shipped file); ``None`` otherwise."""
    if isinstance(strategy, ConductorStrategy):
        pool = strategy.orchestrator.pool
    elif isinstance(strategy, FixedStrategy):
        pool = strategy.pool
    else:
        return None
    capacity = sample_capacity_of(strategy)
    if capacity is None or concurrency <= capacity.samples:
        return None
    n = capacity.samples
    shares = ", ".join(_share_text(share) for share in capacity.shares)
    fix = f"give --concurrency {n}"
    if any(not share.in_process for share in capacity.shares):
        if pool.path is None:
            where = "the pool"
        elif is_shipped("pool", pool.path):
            where = (
                f"a copy of the shipped pool {pool.name!r} given with --pool "
                "(conductor pools list shows where the shipped pools are)"
            )
        else:
            where = str(pool.path)
        fix += f" or less, or raise max_concurrency in {where}"
    return (
        f"--concurrency {concurrency} is more than the models of pool {pool.name!r} can "
        f"serve: at most {plural(n, 'sample')} can be calling a model at once ({shares}), "
        f"so {plural(concurrency - n, 'sample')} would only wait; {fix}"
    )


def _share_text(share: SampleShare) -> str:
    """One model's share of the samples, as the warning lists it."""
    if share.in_process:
        return (
            f"the in-process model {share.model!r} of {targets_named(share.ids)} takes one "
            "call at a time"
        )
    who = target_name(share.ids[0])
    if share.per_sample == 1:
        return f"{who} {share.samples}"
    return (
        f"{who} {share.samples} (max_concurrency {share.max_concurrency}, "
        f"{share.per_sample} calls per sample)"
    )
