"""The GRPO reward: run each sampled workflow through the executor and grade its answer.

:class:`WorkflowReward` is a reward function in the shape TRL's ``GRPOTrainer`` calls
(``reward(prompts=..., completions=..., **dataset_columns) -> list[float]``), but it
does not import TRL.  For every completion it:

1. takes the Conductor's reply text (plain or conversational completions);
2. executes it with :meth:`Orchestrator.run(question, plan=text) <conductor.execute.
   Orchestrator.run>` on the row's pool (the sub-pool the Conductor was shown, when pools
   are randomised): parsed once, no re-asking, every call through the shared cache and
   per-worker concurrency limits;
3. grades the final answer with the benchmark's grader and turns the outcome into a
   reward with :class:`~conductor.train.config.RewardSettings`.

All completions of a batch run at once (up to ``concurrency``) on ONE background event
loop that lives as long as the reward object, because model clients and their
connections are bound to the loop that made them.

With a per-step ``credit`` other than ``outcome`` (:mod:`conductor.train.credit`), each
one-round rollout also gets a credit for each step of its plan, the character spans of
each step's entries in the reply, and its worker calls by step (cache hits apart); the
``counterfactual`` credit runs the plan again with each single-worker edit, through the
same cache, so the steps an edit leaves alone are cache hits.

A job may continue an earlier record (``continue_from``): the completion is then that
record's next (revision) round, and the rollout is scored on that round's outcome alone.
On-policy recursion training (:mod:`conductor.train.recursion`) builds such jobs from the
round-1 rollouts of the same step and mixes the two rounds' rewards; a dataset row that
carries a given first round (a ``round1`` column holding a record's JSON) is continued
the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..conductors.spec import Conductor
from ..errors import UsageError
from ..execute import Orchestrator, RunSettings
from ..grading import Grader, get_grader
from ..grading.types import Sample
from ..llm.caller import CallerSet
from ..pool import Pool
from ..record import RoundRecord, RunRecord, record_from_dict, record_to_dict
from ..text import plural
from ..workflow import format_workflow, step_spans, workflow_from_dict
from . import credit as step_credit
from .pools import subpool_from_ids
from .settings import CREDIT_ESTIMATORS, RewardSettings

if TYPE_CHECKING:
    from ..llm.cache import ResponseCache
    from .settings import TrainConfig

__all__ = [
    "REQUIRED_COLUMNS",
    "RolloutJob",
    "RolloutResult",
    "WorkflowReward",
    "completion_text",
    "sample_from_row",
    "score_record",
]

log = logging.getLogger("conductor")

#: The dataset columns (see :func:`conductor.train.dataset.build_rows`) the reward reads.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "question",
    "sample_id",
    "gold",
    "grader",
    "grader_options",
    "sample",
)


@dataclass
class RolloutResult:
    """What one completion earned, and what its workflow did (for metrics).

    ``reward`` is what GRPO trains on: the outcome of the round(s) this rollout wrote,
    or for a round-1 rollout of on-policy recursion training the mix of that outcome
    and its own revision's; None for a row that carries no completion to score (TRL
    then gives it no advantage).  ``correct`` is None when nothing was graded
    (unparsed, or no answer).  ``steps``, ``workers`` (worker ids, by step), ``calls``
    (worker calls made, the Conductor's reply not counted) and ``cost_usd`` cover only
    the round this rollout wrote, not an earlier round it continued.

    ``round`` is the Conductor round the completion wrote (1, or 2 for a revision);
    ``round_reward`` that round's own reward before any mixing; ``previous_reward``,
    for a revision, the reward of the round it revised.

    ``step_calls`` holds the worker calls by step of the round it wrote (cache hits
    apart; a counterfactual credit's re-runs included).  With a per-step credit
    (:mod:`conductor.train.credit`) and a plan that ran: ``credits`` holds each step's
    credit, ``spans`` where each step is written in the reply (None when it cannot be
    located: the tokens then get the outcome advantage alone).
    """

    reward: float | None
    parsed: bool
    correct: bool | None
    steps: int
    workers: list[str] = field(default_factory=list)
    calls: int = 0
    cost_usd: float = 0.0
    record: RunRecord | None = None
    round: int = 1
    round_reward: float | None = None
    previous_reward: float | None = None
    credits: list[float] | None = None
    spans: list[list[tuple[int, int]]] | None = None
    step_calls: step_credit.StepCalls | None = None


# --------------------------------------------------------------------------- scoring


@dataclass
class _Outcome:
    reward: float
    parsed: bool
    correct: bool | None
    steps: int
    workers: list[str]
    calls: int
    cost_usd: float


def _spend(rounds: Sequence[RoundRecord]) -> tuple[int, float, int, list[str]]:
    """(worker calls made, their USD cost, steps, worker ids by step) over ``rounds``."""
    calls, cost, steps, workers = 0, 0.0, 0, []
    for rnd in rounds:
        for step in rnd.steps:
            steps += 1
            workers.append(step.worker_id)
            call = step.call
            if step.status != "skipped" and (call.response is not None or call.error is not None):
                calls += 1
                cost += call.cost_usd or 0.0
    return calls, cost, steps, workers


def _outcome(
    record: RunRecord,
    sample: Sample,
    grader: Grader,
    settings: RewardSettings,
    first_round: int = 0,
) -> _Outcome:
    """Grade ``record`` and score the rounds from ``first_round`` on.

    A round "parsed" when it has a workflow: a reply that parsed after re-asking (a live
    Conductor's first round) counts as parsed.  With a given plan there is one try, so
    this is the same as "no parse errors".
    """
    rounds = record.rounds[first_round:]
    calls, cost, steps, workers = _spend(rounds)
    last = record.rounds[-1] if record.rounds else None
    if last is None or last.workflow is None:
        return _Outcome(settings.unparsed, False, None, steps, workers, calls, cost)
    if record.final_answer is None:
        # The workflow parsed, but no step gave an answer (every worker failed).
        return _Outcome(settings.failed_run, True, None, steps, workers, calls, cost)
    verdict = grader.grade(record.final_answer, sample)
    record.gold = sample.gold
    record.grade = verdict.to_dict()
    base = settings.correct if verdict.correct else settings.parsed_wrong
    reward = (
        base
        + settings.format_bonus
        - settings.cost_penalty_per_usd * cost
        - settings.cost_penalty_per_call * calls
    )
    return _Outcome(reward, True, verdict.correct, steps, workers, calls, cost)


def score_record(
    record: RunRecord, sample: Sample, grader: Grader, settings: RewardSettings
) -> float:
    """The reward ``record`` earns under ``settings``, graded by ``grader`` on ``sample``.

    The same rule the trainer's reward applies to a one-round rollout: ``unparsed`` when
    the last round has no workflow, ``failed_run`` when it produced no answer, else
    ``correct`` / ``parsed_wrong`` plus ``format_bonus`` minus the cost penalties (over
    every round of the record).
    """
    return _outcome(record, sample, grader, settings).reward


def _round_calls(record: RunRecord, start: int) -> step_credit.StepCalls | None:
    """The worker calls by step of the round a rollout wrote (None: it wrote none)."""
    rnd = record.rounds[-1] if len(record.rounds) > start else None
    if rnd is None or rnd.workflow is None:
        return None
    return step_credit.step_calls(rnd, len(workflow_from_dict(rnd.workflow).steps))


# --------------------------------------------------------------------------- rows


def completion_text(completion: Any) -> str:
    """The Conductor's reply from a TRL completion: a string, or a conversational list
    of messages (the assistant messages' text is joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, Sequence):
        parts: list[str] = []
        for message in completion:
            if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
                continue
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                # Content given as parts: keep the text ones.
                parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return "".join(parts)
    return str(completion)


def _loads(text: Any, what: str) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError as exc:
        raise UsageError(f"dataset column {what!r} is not valid JSON: {exc.msg}") from None
    except (ValueError, RecursionError):  # a number of thousands of digits, deep nesting
        raise UsageError(f"dataset column {what!r} is not JSON that can be read") from None


def sample_from_row(sample_id: str, sample_json: Any, gold_json: Any) -> Sample:
    """Rebuild the :class:`Sample` a grader needs from a dataset row's columns."""
    data = _loads(sample_json, "sample") or {}
    return Sample(
        id=sample_id,
        input=dict(data.get("input") or {}),
        gold=_loads(gold_json, "gold"),
        metadata=dict(data.get("metadata") or {}),
    )


@dataclass(frozen=True)
class RolloutJob:
    """One completion to execute and grade: the Conductor's reply ``text`` for the
    question of one dataset row, run by ``orchestrator`` (the row's sub-pool) and graded
    by ``grader`` on ``sample``.  With ``continue_from`` the reply is the next round of
    that earlier record of the same question (which is copied, never changed)."""

    orchestrator: Orchestrator
    question: str
    text: str
    sample: Sample
    grader: Grader
    sample_id: str
    continue_from: RunRecord | None = None
    #: The row's cost weight (a cost-conditioned run): charged per USD in place of
    #: ``RewardSettings.cost_penalty_per_usd``; None: the settings' own penalty.
    cost_weight: float | None = None

    def reward_settings(self, settings: RewardSettings) -> RewardSettings:
        """``settings`` as they score this job: with the row's weight as the USD penalty."""
        if self.cost_weight is None:
            return settings
        return replace(settings, cost_penalty_per_usd=self.cost_weight)


# --------------------------------------------------------------------------- the reward


class WorkflowReward:
    """A GRPO reward function that executes and grades Conductor workflows.

    ``pool`` is the full training pool (rows name the workers they were shown with
    ``worker_ids``); ``conductor`` sets the prompt template, step limit and description
    setting, which must be those the prompts were built with.  ``cache`` is shared by
    every worker call; ``concurrency`` bounds the rollouts in flight; ``run_settings``
    are the per-question limits (default: the Conductor's ``max_steps``, no budget).
    """

    __name__ = "conductor_reward"

    def __init__(
        self,
        pool: Pool,
        conductor: Conductor,
        settings: RewardSettings,
        *,
        cache: ResponseCache | None = None,
        concurrency: int = 32,
        run_settings: RunSettings | None = None,
        credit: str = "outcome",
    ) -> None:
        if credit not in CREDIT_ESTIMATORS:
            raise UsageError(f"unknown credit {credit!r}: one of {', '.join(CREDIT_ESTIMATORS)}")
        self.credit = credit
        self.pool = pool
        self.conductor = conductor
        self.settings = settings
        self.concurrency = max(1, concurrency)
        self.run_settings = run_settings or RunSettings(max_steps=conductor.max_steps)
        self.callers = CallerSet(cache)
        self.last_batch: list[RolloutResult] = []
        self._orchestrators: dict[tuple[str, ...], Orchestrator] = {}
        self._graders: dict[tuple[str, str], Grader] = {}
        self._round1: dict[str, dict[str, Any]] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="conductor-reward", daemon=True
        )
        self._thread.start()

    @classmethod
    def from_config(
        cls,
        config: TrainConfig,
        pool: Pool,
        conductor: Conductor,
        *,
        cache: ResponseCache | None = None,
        concurrency: int = 32,
    ) -> WorkflowReward:
        """The reward a training config asks for (its reward settings and step limit)."""
        return cls(
            pool,
            conductor,
            config.reward,
            cache=cache,
            concurrency=concurrency,
            run_settings=RunSettings(max_steps=config.max_steps),
            credit=config.credit,
        )

    # ---------------------------------------------------------------- lookups

    def orchestrator(self, worker_ids: Sequence[str] | None) -> Orchestrator:
        """The orchestrator for the sub-pool ``worker_ids`` (the full pool when empty);
        every orchestrator shares this reward's callers (cache, concurrency limits)."""
        key = tuple(worker_ids) if worker_ids else tuple(w.id for w in self.pool.workers)
        orch = self._orchestrators.get(key)
        if orch is None:
            sub = subpool_from_ids(self.pool, key).pool
            orch = Orchestrator(sub, self.conductor, callers=self.callers)
            self._orchestrators[key] = orch
        return orch

    def _grader(self, name: str, options_json: Any) -> Grader:
        options = _loads(options_json, "grader_options") or {}
        key = (name, json.dumps(options, sort_keys=True))
        grader = self._graders.get(key)
        if grader is None:
            grader = get_grader(name, options)
            self._graders[key] = grader
        return grader

    def _first_round(self, text: str) -> RunRecord:
        data = self._round1.get(text)
        if data is None:
            data = json.loads(text)
            self._round1[text] = data  # parsed once per distinct record
        return record_from_dict(data)

    # ---------------------------------------------------------------- the call

    def __call__(
        self, prompts: list[Any], completions: list[Any], **columns: Any
    ) -> list[float | None]:
        """Rewards for ``completions`` (aligned with ``prompts`` and every column)."""
        results = self.run(self.jobs([completion_text(c) for c in completions], columns))
        return [r.reward for r in results]

    def jobs(self, texts: Sequence[str], columns: dict[str, Any]) -> list[RolloutJob]:
        """One job per reply in ``texts``, from the dataset columns of its row (lists
        aligned with ``texts``, as TRL passes them to a reward function)."""
        n = len(texts)
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise UsageError(
                f"the training dataset lacks {plural(len(missing), 'column')} "
                f"({', '.join(missing)}) the reward "
                "needs (build it with conductor.train.dataset.build_rows)"
            )

        def column(name: str, default: Any) -> list[Any]:
            values = columns.get(name)
            if values is None:
                return [default] * n
            values = list(values)
            if len(values) != n:
                raise UsageError(f"column {name!r} has {len(values)} values for {n} completions")
            return values

        questions = column("question", "")
        ids = column("sample_id", "")
        golds = column("gold", "null")
        graders = column("grader", "")
        options = column("grader_options", "{}")
        samples = column("sample", "{}")
        worker_ids = column("worker_ids", None)
        round1 = column("round1", "")
        weights = column("cost_weight", None)
        return [
            RolloutJob(
                orchestrator=self.orchestrator(worker_ids[i]),
                question=str(questions[i]),
                text=texts[i],
                sample=sample_from_row(str(ids[i]), samples[i], golds[i]),
                grader=self._grader(str(graders[i]), options[i]),
                sample_id=str(ids[i]),
                continue_from=self._first_round(round1[i]) if round1[i] else None,
                cost_weight=None if weights[i] is None else float(weights[i]),
            )
            for i in range(n)
        ]

    def run(self, jobs: Sequence[RolloutJob]) -> list[RolloutResult]:
        """Execute and grade ``jobs`` at once (up to ``concurrency`` in flight); the
        results, in order, are also kept as :attr:`last_batch`."""
        if self._closed:
            raise RuntimeError("this WorkflowReward is closed")
        future = asyncio.run_coroutine_threadsafe(self._run_all(list(jobs)), self._loop)
        results = future.result()
        self.last_batch = results
        return results

    async def _run_all(self, jobs: list[RolloutJob]) -> list[RolloutResult]:
        limit = asyncio.Semaphore(self.concurrency)
        return list(await asyncio.gather(*(self._rollout(job, limit) for job in jobs)))

    async def _rollout(self, job: RolloutJob, limit: asyncio.Semaphore) -> RolloutResult:
        start = 0
        try:
            async with limit:
                if job.continue_from is not None:
                    # A copy: the executor extends the record it continues, and one
                    # round-1 record may be continued by several jobs.
                    earlier = record_from_dict(record_to_dict(job.continue_from))
                    start = len(earlier.rounds)
                    record = await job.orchestrator.run(
                        job.question,
                        replace(self.run_settings, rounds=start + 1),
                        sample_id=job.sample_id,
                        plan=job.text,
                        continue_from=earlier,
                    )
                else:
                    record = await job.orchestrator.run(
                        job.question,
                        replace(self.run_settings, rounds=1),
                        sample_id=job.sample_id,
                        plan=job.text,
                    )
            # Graders may block (math-verify, code under test): keep the loop free.
            out = await asyncio.to_thread(
                _outcome, record, job.sample, job.grader, job.reward_settings(self.settings), start
            )
            credits = None
            if self.credit != "outcome" and start == 0 and out.parsed:
                try:
                    async with limit:
                        credits = await self._credit(job, record, out.reward)
                except Exception as exc:  # the outcome stands: its tokens keep one advantage
                    log.warning(
                        "reward: step credit for %s failed: %r", job.sample_id, exc, exc_info=True
                    )
            calls = credits[2] if credits else _round_calls(record, start)
        except Exception as exc:  # one broken rollout must not end a long training run
            log.warning("reward: rollout for %s failed: %r", job.sample_id, exc, exc_info=True)
            failed = self.settings.failed_run
            return RolloutResult(failed, False, None, 0, round=start + 1, round_reward=failed)
        return RolloutResult(
            reward=out.reward,
            parsed=out.parsed,
            correct=out.correct,
            steps=out.steps,
            workers=out.workers,
            calls=out.calls,
            cost_usd=out.cost_usd,
            record=record,
            round=start + 1,
            round_reward=out.reward,
            credits=credits[0] if credits else None,
            spans=credits[1] if credits else None,
            step_calls=calls,
        )

    async def _credit(
        self, job: RolloutJob, record: RunRecord, reward: float
    ) -> tuple[list[float], list[list[tuple[int, int]]] | None, step_credit.StepCalls] | None:
        """The step credits of a one-round rollout whose plan ran, the spans of its steps
        in the reply, and its worker calls by step (see :class:`RolloutResult`)."""
        rnd = record.rounds[-1]
        if rnd.workflow is None:
            return None
        workflow = workflow_from_dict(rnd.workflow)
        n = len(workflow.steps)
        calls = step_credit.step_calls(rnd, n)
        if self.credit == "structure":
            failed = await asyncio.to_thread(
                step_credit.step_failures, rnd, n, job.sample, job.grader
            )
            credits = step_credit.structure_credit(failed)
        elif self.credit == "descendant":
            failed = await asyncio.to_thread(
                step_credit.step_failures, rnd, n, job.sample, job.grader
            )
            quality = [0.0 if f else 1.0 for f in failed]
            visible = workflow.dependencies()
            credits = step_credit.descendant_credit(quality, visible, step_credit.answer_step(rnd))
        else:
            n_workers = len(job.orchestrator.pool.workers)
            # Scored as the actual run is: with the row's cost weight, if it has one.
            settings = job.reward_settings(self.settings)
            edits = step_credit.worker_edits(workflow, n_workers)
            flat = [plan for plans in edits for plan in plans]
            records = await asyncio.gather(
                *(
                    job.orchestrator.run(
                        job.question,
                        replace(self.run_settings, rounds=1),
                        sample_id=job.sample_id,
                        plan=format_workflow(plan),
                    )
                    for plan in flat
                )
            )
            scores = []
            for edited in records:
                scores.append(
                    await asyncio.to_thread(_outcome, edited, job.sample, job.grader, settings)
                )
                if edited.rounds:
                    calls.add(step_credit.step_calls(edited.rounds[-1], n))
            rewards = iter([s.reward for s in scores])
            per_step = [[next(rewards) for _ in plans] for plans in edits]
            credits = step_credit.counterfactual_credit(reward, per_step)
        return credits, step_spans(job.text, n), calls

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Close every client and stop the background loop (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self.callers.aclose(), self._loop).result(timeout=30)
        except Exception as exc:  # closing must not hide the error that led here
            log.warning("reward: closing the model clients failed: %r", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> WorkflowReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
