"""Per-step credit: how much each step of a sampled plan earned, from its run record.

GRPO's reward is one number per completion (:mod:`conductor.train.reward`), and TRL's
group-normalised advantage gives it to every token of the plan.  A training config's
``credit`` setting (:data:`CREDIT_ESTIMATORS`) can instead give each step of the plan a
credit of its own, added to the advantage of that step's tokens (:func:`token_advantages`;
the spans come from :func:`conductor.workflow.step_spans`):

* ``outcome`` (the default, and the paper's): no step credit; every token gets the
  completion's advantage.
* ``structure`` (after FloWright, arXiv 2610.01026): a step that failed (its own answer
  graded wrong against the gold by the benchmark's grader, or no answer: an error, a
  skip) is penalised by its share of the failed steps, ``-1 / F`` with ``F`` the number
  of failed steps of the plan; the others get 0 (:func:`structure_credit`).
* ``descendant`` (after ASPO, arXiv 2609.32430): a step's credit is the quality gain
  within its descendant subgraph, the steps that see its answer (transitively, through
  the access lists) on the way to the final answer (:func:`descendant_credit`).
* ``counterfactual`` (after LEMON, arXiv 2605.14483): the plan is run again with one
  field of one step edited (that step's worker swapped for each other worker of the
  pool, :func:`worker_edits`); a step's credit is the actual reward minus the mean
  reward of its edits (:func:`counterfactual_credit`).  The steps an edit leaves
  unchanged and that see no edited step send the same calls as the actual run, so they
  are call-cache hits.

The papers' own texts could not be read here: these definitions are ours, written from
the one-line summaries of issue 40 and stated exactly in ``docs/training.md``.
Everything here is a pure function of records and numbers; executing the edits is the
reward's (:class:`~conductor.train.reward.WorkflowReward`), mixing into TRL's loss is
the trainer's (:mod:`conductor.train.grpo`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..workflow import Workflow
from .settings import CREDIT_ESTIMATORS

if TYPE_CHECKING:
    from ..grading import Grader
    from ..grading.types import Sample
    from ..record import RoundRecord

__all__ = [
    "CREDIT_ESTIMATORS",
    "StepCalls",
    "answer_step",
    "counterfactual_credit",
    "descendant_credit",
    "step_calls",
    "step_failures",
    "structure_credit",
    "token_advantages",
    "worker_edits",
]


def answer_step(rnd: RoundRecord) -> int | None:
    """The index of the step whose answer is the round's (the executor's plain rule: the
    last step that finished with an answer), or None when none did."""
    done = [s.index for s in rnd.steps if s.status == "ok" and s.answer]
    return max(done) if done else None


def step_failures(rnd: RoundRecord, n_steps: int, sample: Sample, grader: Grader) -> list[bool]:
    """For each of the ``n_steps`` steps of ``rnd``: whether it failed, i.e. gave no
    answer (an error, a skip, a step never run) or an answer ``grader`` grades wrong
    against ``sample``'s gold."""
    failed = [True] * n_steps
    for step in rnd.steps:
        if 0 <= step.index < n_steps and step.status == "ok" and step.answer:
            failed[step.index] = not grader.grade(step.answer, sample).correct
    return failed


def structure_credit(failed: Sequence[bool]) -> list[float]:
    """Each failed step's credit is ``-1 / F`` (its share of the ``F`` failed steps), the
    others' 0: the penalty of a plan is spread evenly over the steps that failed it."""
    n_failed = sum(failed)
    return [-1.0 / n_failed if f else 0.0 for f in failed]


def _descendants(visible: Sequence[Sequence[int]]) -> list[set[int]]:
    """For each step, the later steps that see its answer, directly or through others."""
    n = len(visible)
    seen_by: list[set[int]] = [set() for _ in range(n)]
    # A step sees only earlier steps, so walking backwards finds every descendant of a
    # later step before it is needed.
    for s in range(n - 1, -1, -1):
        for d in range(s + 1, n):
            if s in visible[d]:
                seen_by[s].add(d)
                seen_by[s] |= seen_by[d]
    return seen_by


def descendant_credit(
    quality: Sequence[float], visible: Sequence[Sequence[int]], final: int | None
) -> list[float]:
    """Each step's quality gain within its descendant subgraph.

    ``quality[s]`` is 1.0 for a step whose own answer is right, 0.0 otherwise;
    ``visible[s]`` the earlier steps step ``s`` saw; ``final`` the step whose answer is
    the plan's (None: no answer, every credit 0).  A step's own gain is its quality
    minus the best quality among the steps it saw (0 when it saw none): what it added
    to what it was given.  Its credit is the sum of the gains of itself and of its
    descendants that lie on the way to the final answer (the final step and the steps
    it sees, transitively); a step whose answer never reaches the final answer gets 0.
    """
    n = len(quality)
    if final is None or not 0 <= final < n:
        return [0.0] * n
    gain = [quality[s] - max((quality[p] for p in visible[s]), default=0.0) for s in range(n)]
    descendants = _descendants(visible)
    feeds_final = {s for s in range(n) if s == final or final in descendants[s]}
    return [
        sum(gain[d] for d in ({s} | descendants[s]) & feeds_final) if s in feeds_final else 0.0
        for s in range(n)
    ]


def worker_edits(workflow: Workflow, n_workers: int) -> list[list[Workflow]]:
    """For each step of ``workflow``: the plans that differ from it in that step's worker
    alone, one for each other worker of a pool of ``n_workers``."""
    edits: list[list[Workflow]] = []
    for i, step in enumerate(workflow.steps):
        plans = []
        for worker in range(n_workers):
            if worker == step.worker:
                continue
            steps = list(workflow.steps)
            steps[i] = replace(step, worker=worker)
            plans.append(Workflow(tuple(steps)))
        edits.append(plans)
    return edits


def counterfactual_credit(actual: float, edit_rewards: Sequence[Sequence[float]]) -> list[float]:
    """For each step, ``actual`` minus the mean reward of its edits (0 without edits:
    a pool of one worker leaves nothing to compare with)."""
    return [actual - sum(r) / len(r) if r else 0.0 for r in edit_rewards]


@dataclass
class StepCalls:
    """Worker calls by step index: those answered by a model, and cache hits apart."""

    made: list[int]
    cached: list[int]

    def add(self, other: StepCalls) -> None:
        width = max(len(self.made), len(other.made))
        for mine in (self.made, self.cached):
            mine.extend([0] * (width - len(mine)))
        for i, n in enumerate(other.made):
            self.made[i] += n
        for i, n in enumerate(other.cached):
            self.cached[i] += n


def step_calls(rnd: RoundRecord, n_steps: int) -> StepCalls:
    """The worker calls of ``rnd``'s steps, by step: a call that was sent (answered or
    failed) counts under ``made`` when a model answered it, under ``cached`` when the
    call cache did (a skipped step made none)."""
    out = StepCalls([0] * n_steps, [0] * n_steps)
    for step in rnd.steps:
        call = step.call
        if not 0 <= step.index < n_steps or step.status == "skipped":
            continue
        if call.response is None and call.error is None:
            continue
        if call.cached:
            out.cached[step.index] += 1
        else:
            out.made[step.index] += 1
    return out


def token_advantages(
    advantage: float,
    token_ends: Sequence[int],
    spans: Sequence[Sequence[tuple[int, int]]],
    credits: Sequence[float],
    weight: float,
) -> list[float]:
    """The advantage of each token of a completion: ``advantage + weight * credits[s]``
    for a token whose characters overlap a span of step ``s`` (the first such step when a
    token overlaps two), ``advantage`` for every other token (the reasoning, the labels,
    the brackets).  ``token_ends[t]`` is the character offset just past token ``t`` in
    the completion's text (so token ``t`` covers ``token_ends[t-1]:token_ends[t]``)."""
    out: list[float] = []
    begin = 0
    for end in token_ends:
        value = advantage
        for s, step_spans in enumerate(spans):
            if s < len(credits) and any(a < end and begin < b for a, b in step_spans):
                value = advantage + weight * credits[s]
                break
        out.append(value)
        begin = max(begin, end)
    return out
