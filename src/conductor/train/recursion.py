"""Recursion fine-tuning: forced second rounds, sampled on-policy in the same step.

In the paper's recursion fine-tune, the questions get one extra round: the Conductor
sees its previous plan and that plan's final answer and writes a new workflow (or
three empty lists to keep the answer).  Both rounds are rollouts of the policy being
trained, in the same step and the same GRPO group.  ``recursion.fraction`` of the
questions are marked (:func:`mark_recursion_rows`); 1.0 marks all of them, which is
the authors' layout (their trainer gives the first half of every question's group to
round 1 and the second half to the revisions, the k-th revising the k-th plan):

* every marked question's group is split into pairs of rollouts; in each pair the
  first row's completion is a round-1 plan, and the second row's completion is the
  revision the *current* policy writes after seeing that plan executed;
* the revision is rewarded on its own round (``r2``), and the round-1 plan is
  rewarded :func:`mixed_reward` ``= (1 - d) * r1 + d * r2`` with its *own* revision's
  ``r2``, so a plan whose revision goes well earns more, and the discount ``d`` moves
  the round-1 rollouts' group-normalised advantages.

:func:`recursion_rollouts` runs one generation batch of this (it is told how to ask the
policy for the revisions); the TRL side, which generates and trains, lives in
:mod:`conductor.train.trainer`.  The round-2 prompt is built by the same Conductor
prompt functions as the executor's revision round, so what the policy is trained on is
what it sees at inference.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..conductors.prompt import PreviousRound, build_conductor_messages
from ..conductors.spec import Conductor
from ..errors import UsageError
from ..execute import Orchestrator, RunSettings, last_plan_reply
from ..llm.types import Message
from ..record import RunRecord
from ..targets import Worker
from ..workflow import format_workflow, workflow_from_dict

if TYPE_CHECKING:
    from .reward import RolloutResult, WorkflowReward

__all__ = [
    "RECURSION_COLUMN",
    "ROLLOUT_COLUMN",
    "RecursionBatch",
    "RecursionReward",
    "can_revise",
    "first_round",
    "mark_recursion_rows",
    "mixed_reward",
    "pair_slots",
    "previous_round",
    "recursion_rollouts",
    "revision_messages",
]

#: The dataset column that marks a question for a forced second round.
RECURSION_COLUMN = "recursion"
#: The column that hands a batch's scored rollouts from generation to the reward.
ROLLOUT_COLUMN = "conductor_rollout"

#: Asks the current policy for one reply per prompt (all of a batch's revision prompts
#: at once, possibly none); returns the replies' text, in order.
Generate = Callable[[list[list[Message]]], list[str]]


def previous_round(record: RunRecord) -> PreviousRound | None:
    """What a revision round is shown of ``record``: its last workflow and its final
    answer, or None when it has no workflow or no answer to revise."""
    last = next((rnd.workflow for rnd in reversed(record.rounds) if rnd.workflow), None)
    if last is None or record.final_answer is None:
        return None
    # The reply that wrote the plan goes along, as the executor's revision round sends it:
    # a chat template continues the conversation with it as the assistant turn.
    return PreviousRound(
        format_workflow(workflow_from_dict(last)), record.final_answer, last_plan_reply(record)
    )


def can_revise(record: RunRecord) -> bool:
    """Whether ``record`` can be continued by a revision round (it has a plan and an answer)."""
    return previous_round(record) is not None


def revision_messages(
    record: RunRecord, pool_workers: Sequence[Worker], conductor: Conductor
) -> list[Message]:
    """The round-2 prompt for ``record``: the question and pool listing as in round 1,
    then the previous plan and final answer with the instruction to revise or keep it.

    ``pool_workers`` must be the workers ``record`` ran on, in the same order.  Raises
    :class:`UsageError` when the record has nothing to revise (see :func:`can_revise`).
    """
    previous = previous_round(record)
    if previous is None:
        raise UsageError(
            f"run {record.run_id} has no workflow with a final answer, so it cannot be revised"
        )
    return build_conductor_messages(
        record.question,
        pool_workers,
        max_steps=conductor.max_steps,
        template=conductor.template,
        show_descriptions=conductor.show_descriptions,
        previous=previous,
        subtasks=conductor.subtasks,
        cost_weight=conductor.cost_weight,
    )


async def first_round(
    orchestrator: Orchestrator, question: str, plan: str | None = None
) -> RunRecord:
    """Run round 1 of ``question``: with ``plan`` (a reply already written) executed as
    given, or else with the orchestrator's Conductor asked for one."""
    settings = RunSettings(max_steps=orchestrator.conductor.max_steps, rounds=1)
    return await orchestrator.run(question, settings, plan=plan)


# --------------------------------------------------------------------------- on-policy


def mixed_reward(first: float, revision: float, discount: float) -> float:
    """A round-1 rollout's reward: ``(1 - discount) * first + discount * revision``,
    where ``revision`` is the reward of that rollout's own round-2 continuation."""
    return (1.0 - discount) * first + discount * revision


def mark_recursion_rows(rows: list[dict[str, Any]], fraction: float, *, seed: int) -> int:
    """Mark ``round(fraction * len(rows))`` rows (questions), drawn with
    ``random.Random(seed)``, for a forced second round (their :data:`RECURSION_COLUMN`
    is True, the others' False); return how many were marked.

    A marked row's whole GRPO group becomes (round-1, revision) pairs
    (:func:`pair_slots`), so ``fraction`` 1.0 gives every question half round-1 plans
    and half revisions, and a smaller one leaves the unmarked questions' groups as
    ordinary one-round rollouts."""
    chosen = set(random.Random(seed).sample(range(len(rows)), round(fraction * len(rows))))
    for i, row in enumerate(rows):
        row[RECURSION_COLUMN] = i in chosen
    return len(chosen)


def pair_slots(flags: Sequence[Any], sample_ids: Sequence[Any]) -> list[tuple[int, int]]:
    """The (round-1 row, round-2 row) pairs of a generation batch: neighbouring rows
    that are both marked for recursion and ask the same question.

    GRPO puts a question's rollouts next to each other, so each even-sized group of a
    marked question becomes ``group_size / 2`` pairs; a row left over (an odd group)
    is an ordinary one-round rollout.
    """
    pairs: list[tuple[int, int]] = []
    i = 0
    while i + 1 < len(flags):
        if flags[i] and flags[i + 1] and sample_ids[i] == sample_ids[i + 1]:
            pairs.append((i, i + 1))
            i += 2
        else:
            i += 1
    return pairs


@dataclass
class RecursionBatch:
    """One generation batch of recursion training, scored.

    ``results[i]`` is row ``i``'s rollout (its ``reward`` is what GRPO trains on);
    ``revised`` lists the round-2 rows whose completion is a revision, in the order
    ``prompts`` (their round-2 prompts) were given to the policy.
    """

    results: list[RolloutResult]
    revised: list[int]
    prompts: list[list[Message]]


def recursion_rollouts(
    reward: WorkflowReward,
    columns: Mapping[str, Sequence[Any]],
    first_texts: Sequence[str],
    *,
    discount: float,
    generate: Generate,
) -> RecursionBatch:
    """Score one generation batch whose replies ``first_texts`` the policy just wrote
    for the rows ``columns`` (dataset columns, aligned with ``first_texts``).

    Every row but a pair's round-2 row is executed as a round 1.  For each pair whose
    round 1 has a plan and an answer, the round-2 prompt is built from that record and
    ``generate`` asks the policy for the revision (``generate`` is called exactly
    once, with an empty list when nothing can be revised); the revision continues the
    record and is graded.  A pair's round-1 row earns :func:`mixed_reward` of its
    outcome and its revision's; its round-2 row earns the revision's own reward.  When
    round 1 left nothing to revise (no plan, or no answer), its outcome stands (round-1
    reward ``r1``) and the round-2 row is not scored (reward None: no advantage).
    """
    from .reward import RolloutResult

    n = len(first_texts)
    flags = list(columns.get(RECURSION_COLUMN) or [False] * n)
    pairs = pair_slots(flags, list(columns["sample_id"]))
    second = {j for _, j in pairs}
    jobs = reward.jobs(first_texts, dict(columns))
    firsts = [i for i in range(n) if i not in second]
    results: list[RolloutResult | None] = [None] * n
    for i, result in zip(firsts, reward.run([jobs[i] for i in firsts]), strict=True):
        results[i] = result

    revisable: list[tuple[int, int, RunRecord]] = []
    prompts: list[list[Message]] = []
    for i, j in pairs:
        done = results[i]
        record = done.record if done is not None else None
        if record is None or not can_revise(record):
            continue
        workers = jobs[i].orchestrator.pool.workers
        prompts.append(revision_messages(record, workers, reward.conductor))
        revisable.append((i, j, record))
    texts = generate(prompts)
    if len(texts) != len(prompts):
        raise RuntimeError(f"asked the policy for {len(prompts)} revisions, got {len(texts)}")
    revisions = reward.run(
        [
            replace(jobs[i], text=text, continue_from=record)
            for (i, _j, record), text in zip(revisable, texts, strict=True)
        ]
    )
    for (i, j, _record), revision in zip(revisable, revisions, strict=True):
        first = results[i]
        assert first is not None and first.round_reward is not None
        assert revision.round_reward is not None
        results[i] = replace(
            first, reward=mixed_reward(first.round_reward, revision.round_reward, discount)
        )
        results[j] = replace(revision, previous_reward=first.round_reward)
    unscored = RolloutResult(reward=None, parsed=False, correct=None, steps=0, round=2)
    final = [r if r is not None else replace(unscored) for r in results]
    return RecursionBatch(results=final, revised=[j for _, j, _ in revisable], prompts=prompts)


class RecursionReward:
    """The reward function TRL calls during recursion training: the rollouts were
    already executed and scored while the batch was generated (see
    :func:`recursion_rollouts`) and arrive in the :data:`ROLLOUT_COLUMN` column."""

    __name__ = "conductor_reward"

    def __init__(self) -> None:
        self.last_batch: list[RolloutResult] = []

    def __call__(
        self, prompts: list[Any], completions: list[Any], **columns: Any
    ) -> list[float | None]:
        results = columns.get(ROLLOUT_COLUMN)
        if results is None or len(results) != len(completions):
            raise RuntimeError(
                "recursion training's reward needs the rollouts scored during generation; "
                "use the trainer built by conductor.train.trainer"
            )
        self.last_batch = list(results)
        return [r.reward for r in self.last_batch]

    def close(self) -> None:
        """Nothing to release (the rollouts ran on the trainer's WorkflowReward)."""
