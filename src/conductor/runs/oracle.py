"""The per-question oracle: the most a router choosing among some runs' strategies can
score.  This module is its one definition; ``report`` (the line under the comparison
and ``--plot``'s line), ``view`` (the chart's line) and ``fit-router`` (the ``oracle``
row on the held-out questions) all compute it here.

- A *question* is a sample of a benchmark that every run answered; its epochs are
  repeats of the same question, not questions of their own.
- An arm's score on a question is its mean score over the question's epochs
  (:func:`question_score`), each record's grade score read by :func:`unit_score` (a run
  that failed, or a score that is not a number in [0, 1], counts as 0).
- On each question the oracle picks the arm with the highest such score, the cheaper
  one on a tie (:func:`oracle_picks`), and scores the mean of what it picked over the
  questions (:func:`question_oracle`).

Why the mean over epochs, not "some arm was right on some epoch": a router picks an arm
for a question before any of its answers exists, so what it can get from an arm on a
question is that arm's expected score there, which the mean of its epochs estimates.
Two workers that are each right on one of two epochs make an oracle of 50%, not 100%:
"some single got it right on some try" is pass@k over workers, a different quantity,
which no router reaches.  With one epoch both readings agree (README: "on each question,
the best any single got: the most a router choosing among them can score").  This is
not the paper's ``oracle-best``, which is the best single run overall
(:func:`conductor.runs.summary.best_single`).

Pure Python (no numpy): ``view`` and ``report`` need it without the router's extras.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "QuestionOracle",
    "oracle_of_runs",
    "oracle_picks",
    "question_oracle",
    "question_score",
    "unit_score",
]

_Q = TypeVar("_Q", bound=Hashable)


@dataclass(frozen=True)
class QuestionOracle:
    """The per-question oracle of some arms (see the module): its ``accuracy`` (a
    fraction in [0, 1]) over the ``questions`` every arm answered, and the best single
    arm's accuracy on the same questions (``best_single``)."""

    accuracy: float
    questions: int
    arms: tuple[str, ...]
    best_single: float


def unit_score(score: object) -> float:
    """A record's grade score as the oracle counts it: a number in [0, 1], else 0
    (no grade, a failed run, a damaged value)."""
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return 0.0
    return min(1.0, max(0.0, float(score)))


def question_score(epochs: Mapping[int, float]) -> float:
    """An arm's score on one question: the mean of its epochs' scores."""
    if not epochs:
        raise ValueError("question_score: an arm's question has at least one epoch")
    return sum(epochs.values()) / len(epochs)


def oracle_picks(
    scores: Sequence[Sequence[float]], costs: Sequence[Sequence[float]] | None = None
) -> list[int]:
    """On each question (a row of ``scores``: each arm's :func:`question_score`), the
    arm the oracle picks: the highest score, then the lowest cost in ``costs`` (a row
    per question, like ``scores``), then the first."""
    picks = []
    for i, row in enumerate(scores):
        cost = costs[i] if costs is not None else [0.0] * len(row)
        picks.append(min(range(len(row)), key=lambda j: (-row[j], cost[j], j)))
    return picks


def question_oracle(arms: Sequence[str], scores: Sequence[Sequence[float]]) -> QuestionOracle:
    """The oracle of ``arms`` over the questions of ``scores`` (a row per question,
    each arm's :func:`question_score`, in the order of ``arms``)."""
    n = len(scores)
    if n == 0:
        raise ValueError("question_oracle: no question answered by every arm")
    picked = [row[j] for row, j in zip(scores, oracle_picks(scores), strict=True)]
    alone = [sum(row[j] for row in scores) / n for j in range(len(arms))]
    return QuestionOracle(
        accuracy=sum(picked) / n, questions=n, arms=tuple(arms), best_single=max(alone)
    )


def oracle_of_runs(runs: Mapping[str, Mapping[_Q, Mapping[int, float]]]) -> QuestionOracle | None:
    """The oracle of the runs ``runs`` (by arm: each question's score on each epoch,
    read with :func:`unit_score`) over the questions every one of them answered;
    ``None`` with fewer than two arms or no question in common."""
    if len(runs) < 2:
        return None
    arms = list(runs)
    common = set.intersection(*(set(runs[a]) for a in arms))
    if not common:
        return None
    # Sorted by their text: the picks do not depend on the order, the sums' last bits do.
    order = sorted(common, key=str)
    return question_oracle(arms, [[question_score(runs[a][q]) for a in arms] for q in order])
