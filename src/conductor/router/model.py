"""A fitted router: a question in, the arm to run out (:meth:`Router.route`).

The decision (:meth:`Router.choose`): each arm's chance of a right answer (the head,
:mod:`.head`) less ``cost_weight`` times its mean cost per question in USD.  The arm
that scored best that way over all the training questions is the *default*; a question
leaves it for the arm with the highest figure only when that arm is ahead by more than
``margin``.  ``cost_weight`` is accuracy given up per dollar: 0 routes for accuracy
alone.  The margin is fitted (:mod:`.fit`): where the features say little, the head's
small differences between arms are mostly noise, and a router that follows them does
worse than its best arm; with the margin it stays with that arm unless it has reason
to leave it.  A *cascade* router has a ``fallback`` arm (the Conductor,
typically) that it does not route to directly: it goes to it when no other arm's chance
reaches ``threshold``, that is, when the router is unsure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .features import Featurizer
from .head import LogisticHead

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Route", "Router"]


@dataclass(frozen=True)
class Route:
    """Where one question goes, and why."""

    arm: str
    #: Each arm's chance of a right answer, as the head put it.
    chances: dict[str, float]
    #: A cascade router was unsure and sent the question to its fallback.
    fell_back: bool = False


@dataclass(frozen=True)
class Router:
    """Arms, what each costs, the features, the head and the decision's settings."""

    arms: tuple[str, ...]
    #: Mean cost in USD of one run of each arm on the training questions.
    costs: tuple[float, ...]
    featurizer: Featurizer
    head: LogisticHead
    #: Each arm's mean score on the training questions.
    accuracies: tuple[float, ...] = ()
    cost_weight: float = 0.0
    margin: float = 0.0
    fallback: str | None = None
    threshold: float | None = None

    def chances(self, questions: Sequence[str]) -> np.ndarray:
        """``(len(questions), arms)`` chances of a right answer."""
        return self.head.predict(self.featurizer.transform(questions))

    def choose(
        self,
        chances: np.ndarray,
        *,
        cost_weight: float | None = None,
        margin: float | None = None,
        threshold: float | None = None,
        cascade: bool = True,
    ) -> np.ndarray:
        """The index of the arm each row of ``chances`` is routed to (the decision of the
        module's docstring; ``cost_weight``, ``margin`` and ``threshold`` replace the
        router's own, ``cascade=False`` never uses the fallback)."""
        import numpy as np

        weight = self.cost_weight if cost_weight is None else cost_weight
        costs = np.asarray(self.costs)
        utility = chances - weight * costs
        usable = np.ones(len(self.arms), dtype=bool)
        fallback = self.arms.index(self.fallback) if self.fallback in self.arms else None
        if fallback is not None:
            usable[fallback] = False
        utility = np.where(usable, utility, -np.inf)
        picked = np.argmax(utility, axis=1)
        if self.accuracies:
            overall = np.where(usable, np.asarray(self.accuracies) - weight * costs, -np.inf)
            default = int(np.argmax(overall))
            ahead = utility[np.arange(len(picked)), picked] - utility[:, default]
            least = self.margin if margin is None else margin
            picked = np.where(ahead > least, picked, default)
        limit = self.threshold if threshold is None else threshold
        if cascade and fallback is not None and limit is not None:
            best = np.where(usable, chances, -np.inf).max(axis=1)
            picked = np.where(best < limit, fallback, picked)
        return np.asarray(picked)

    def route(self, question: str) -> Route:
        """Where ``question`` goes."""
        chances = self.chances([question])
        index = int(self.choose(chances)[0])
        arm = self.arms[index]
        return Route(
            arm=arm,
            chances={a: round(float(p), 6) for a, p in zip(self.arms, chances[0], strict=True)},
            fell_back=arm == self.fallback,
        )
