"""Fitting a router and measuring it on questions it was not fitted on.

1. **Split** (:func:`held_out`): a question is held out when the SHA-256 of the seed
   and its key falls below the held-out fraction, so the split does not depend on the
   order of the runs or on which other questions are there, and the same question is on
   the same side in every run.
2. **Fit** (:func:`fit_router`): the head on the training questions (:mod:`.head`); the
   best single arm is the one with the highest training accuracy (then the cheapest),
   chosen before the held-out questions are looked at.  The decision's margin (how far
   an arm must be ahead of the default to be chosen, :mod:`.model`) and a cascade's
   threshold are the ones whose decisions score best on the training questions'
   out-of-fold chances (each question's chances from a head fitted without it), ties
   going to the larger margin: the router leaves its best arm only where that paid on
   questions the head had not seen.
3. **Measure**: on the held-out questions, each arm alone, the router, the cascade,
   and the per-question oracle (the best arm of each question: what no router can
   beat, as :mod:`conductor.runs.oracle` defines it), each with
   its accuracy, a 95% bootstrap interval and its mean cost; the router against the
   best single arm as a paired difference with its bootstrap interval and a two-sided
   sign-flip permutation test; and the accuracy-cost frontier across cost weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..runs.oracle import oracle_picks
from .data import RoutingData
from .features import DEFAULT_FEATURIZER, Featurizer, featurizer_from
from .head import fit_head, fold_numbers
from .model import Router

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Comparison",
    "FitSettings",
    "FrontierPoint",
    "Policy",
    "RouterFit",
    "fit_router",
    "held_out",
]

#: Resamples of the bootstrap intervals and sign flips of the paired test.
RESAMPLES = 2000
#: The cost weights of the frontier, in units of 1 / the dearest arm's mean cost.
FRONTIER_SCALE: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class FitSettings:
    """How a router is fitted (``conductor fit-router``'s options)."""

    cost_weight: float = 0.0
    holdout: float = 0.3
    seed: int = 0
    features: str = DEFAULT_FEATURIZER
    feature_settings: dict[str, Any] | None = None
    #: The arm a cascade falls back to when unsure (``None``: no cascade); an arm of the
    #: runs, typically ``conductor``.
    fallback: str | None = None


@dataclass(frozen=True)
class Policy:
    """How one way of choosing an arm did on the held-out questions."""

    name: str
    accuracy: float
    low: float
    high: float
    cost_usd: float
    #: How many questions went to each arm (routers only).
    routed: dict[str, int] | None = None


@dataclass(frozen=True)
class Comparison:
    """The router's accuracy less another policy's, question by question."""

    against: str
    difference: float
    low: float
    high: float
    p_value: float
    #: Questions where one was right and the other not, each way.
    router_only: int
    other_only: int


@dataclass(frozen=True)
class FrontierPoint:
    cost_weight: float
    accuracy: float
    cost_usd: float


@dataclass(frozen=True)
class RouterFit:
    """A fitted router and how it did."""

    router: Router
    settings: FitSettings
    data: RoutingData
    train_rows: tuple[int, ...]
    heldout_rows: tuple[int, ...]
    best_single: str
    policies: tuple[Policy, ...]
    versus_best: Comparison | None
    versus_fallback: Comparison | None
    frontier: tuple[FrontierPoint, ...]
    fit_seconds: float
    #: Mean seconds to route one held-out question (features, head and decision).
    route_seconds: float

    @property
    def training_keys(self) -> tuple[str, ...]:
        return tuple(self.data.keys[i] for i in self.train_rows)

    def evaluation(self) -> dict[str, Any]:
        """The held-out figures, JSON-ready (``router.json`` keeps them; ``--json``
        prints them)."""
        return {
            "arms": list(self.data.arms),
            "train_questions": len(self.train_rows),
            "heldout_questions": len(self.heldout_rows),
            "best_single": self.best_single,
            "policies": [dataclasses.asdict(p) for p in self.policies],
            "versus_best_single": dataclasses.asdict(self.versus_best)
            if self.versus_best
            else None,
            "versus_fallback": (
                dataclasses.asdict(self.versus_fallback) if self.versus_fallback else None
            ),
            "frontier": [dataclasses.asdict(p) for p in self.frontier],
            "fit_seconds": round(self.fit_seconds, 3),
            "route_ms": round(1000 * self.route_seconds, 3),
            "penalty": self.router.head.penalty,
            "margin": self.router.margin,
            "threshold": self.router.threshold,
            "dropped": self.data.dropped,
        }


def held_out(key: str, fraction: float, seed: int) -> bool:
    """Whether the question with ``key`` is held out (see the module's docstring)."""
    digest = hashlib.sha256(f"conductor-router-split:{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _mean_ci(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    import numpy as np

    n = len(values)
    if n == 0:
        return 0.0, 0.0, 0.0
    means = values[rng.integers(0, n, size=(RESAMPLES, n))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(low), float(high)


def _compare(
    name: str, mine: np.ndarray, theirs: np.ndarray, rng: np.random.Generator
) -> Comparison:
    import numpy as np

    diff = mine - theirs
    mean, low, high = _mean_ci(diff, rng)
    flips = rng.choice((-1.0, 1.0), size=(RESAMPLES, len(diff)))
    null = np.abs((flips * diff).mean(axis=1))
    extreme = int((null >= abs(diff.mean()) - 1e-12).sum())
    return Comparison(
        against=name,
        difference=mean,
        low=low,
        high=high,
        p_value=(extreme + 1) / (RESAMPLES + 1),
        router_only=int((diff > 0).sum()),
        other_only=int((diff < 0).sum()),
    )


def _picked(matrix: np.ndarray, choice: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.asarray(matrix[np.arange(len(choice)), choice])


def _out_of_fold(
    features: np.ndarray, scores: np.ndarray, penalty: float, seed: int, folds: int = 5
) -> np.ndarray:
    """Each training question's chances from a head fitted without it."""
    import numpy as np

    n = len(scores)
    k = min(folds, n)
    if k < 2:
        return np.tile(scores.mean(axis=0), (n, 1))
    fold_of = fold_numbers(n, k, seed + 1)
    out = np.zeros_like(scores)
    for f in range(k):
        train, test = fold_of != f, fold_of == f
        head = fit_head(features[train], scores[train], penalties=(penalty,), seed=seed)
        out[test] = head.predict(features[test])
    return out


#: The margins the fit chooses from (chance of a right answer, 0 to 1).
MARGINS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


def _value(router: Router, choice: np.ndarray, scores: np.ndarray, costs: np.ndarray) -> float:
    """What the decisions ``choice`` are worth: mean score less cost weight times cost."""
    return float((_picked(scores, choice) - router.cost_weight * _picked(costs, choice)).mean())


def _margin(router: Router, chances: np.ndarray, scores: np.ndarray, costs: np.ndarray) -> float:
    """The margin whose decisions score best on ``chances`` (ties to the larger)."""
    best, best_value = MARGINS[0], -float("inf")
    for m in MARGINS:
        value = _value(router, router.choose(chances, margin=m, cascade=False), scores, costs)
        if value >= best_value - 1e-12:
            best, best_value = m, max(value, best_value)
    return best


def _threshold(router: Router, chances: np.ndarray, scores: np.ndarray, costs: np.ndarray) -> float:
    """The cascade threshold whose decisions score best on ``chances`` (ties to the
    lower threshold, fewer fallbacks)."""
    import numpy as np

    best, best_value = 0.0, -float("inf")
    for t in np.linspace(0.0, 1.0, 41):
        value = _value(router, router.choose(chances, threshold=float(t)), scores, costs)
        if value > best_value + 1e-12:
            best, best_value = float(t), value
    return best


def fit_router(data: RoutingData, settings: FitSettings | None = None) -> RouterFit:
    """A router fitted on ``data``'s training questions and measured on the held-out ones.

    Raises :class:`~conductor.errors.UsageError` when the split leaves no question on
    one side, or the fallback is not an arm."""
    import numpy as np

    settings = settings or FitSettings()
    if not 0.0 < settings.holdout < 1.0:
        raise UsageError(f"--holdout must be between 0 and 1, got {settings.holdout}")
    if settings.cost_weight < 0:
        raise UsageError(f"--cost-weight must be 0 or more, got {settings.cost_weight}")
    if settings.fallback is not None and settings.fallback not in data.arms:
        raise UsageError(
            f"--fallback {settings.fallback}: no run of that strategy among the runs given "
            f"({', '.join(data.arms)})"
        )
    started = time.perf_counter()
    featurizer: Featurizer = featurizer_from(settings.features, settings.feature_settings)
    heldout = [i for i, k in enumerate(data.keys) if held_out(k, settings.holdout, settings.seed)]
    chosen = set(heldout)
    train = [i for i in range(len(data)) if i not in chosen]
    if not train or not heldout:
        raise UsageError(
            f"{len(data)} questions split {len(train)} for fitting and {len(heldout)} held "
            f"out (--holdout {settings.holdout}): each side needs at least one; give more "
            "questions"
        )
    featurizer, features = featurizer.learned(featurizer.transform(data.prompts), train)
    x_train, y_train = features[train], data.scores[train]
    head = fit_head(x_train, y_train, seed=settings.seed)
    arm_costs = tuple(float(c) for c in data.costs[train].mean(axis=0))
    train_acc = y_train.mean(axis=0)
    router = Router(
        arms=data.arms,
        costs=arm_costs,
        featurizer=featurizer,
        head=head,
        accuracies=tuple(float(a) for a in train_acc),
        cost_weight=settings.cost_weight,
        fallback=settings.fallback,
    )
    oof = _out_of_fold(x_train, y_train, head.penalty, settings.seed)
    c_train = data.costs[train]
    router = dataclasses.replace(router, margin=_margin(router, oof, y_train, c_train))
    if settings.fallback is not None:
        threshold = _threshold(router, oof, y_train, c_train)
        router = dataclasses.replace(router, threshold=threshold)
    fit_seconds = time.perf_counter() - started

    candidates = [j for j, a in enumerate(data.arms) if a != settings.fallback]
    best = min(candidates, key=lambda j: (-round(train_acc[j], 12), arm_costs[j], j))

    x_held, y_held, c_held = features[heldout], data.scores[heldout], data.costs[heldout]
    started = time.perf_counter()
    for i in heldout:
        router.route(data.prompts[i])
    route_seconds = (time.perf_counter() - started) / len(heldout)
    chances = router.head.predict(x_held)
    rng = np.random.default_rng(settings.seed)
    policies: list[Policy] = []

    def add(name: str, choice: np.ndarray, routed: bool) -> np.ndarray:
        got = _picked(y_held, choice)
        acc, low, high = _mean_ci(got, rng)
        counts = {a: int((choice == j).sum()) for j, a in enumerate(data.arms)} if routed else None
        policies.append(Policy(name, acc, low, high, float(_picked(c_held, choice).mean()), counts))
        return got

    n_held = len(heldout)
    singles = {}
    for j, arm in enumerate(data.arms):
        singles[arm] = add(arm, np.full(n_held, j), False)
    routed = add("router", router.choose(chances, cascade=False), True)
    cascade = None
    if settings.fallback is not None:
        cascade = add("cascade", router.choose(chances), True)
    add("oracle", np.asarray(oracle_picks(y_held.tolist(), c_held.tolist()), dtype=int), True)

    versus_best = _compare(data.arms[best], cascade if cascade is not None else routed,
                           singles[data.arms[best]], rng)  # fmt: skip
    versus_fallback = (
        _compare(settings.fallback, cascade, singles[settings.fallback], rng)
        if cascade is not None and settings.fallback is not None
        else None
    )
    dearest = max(arm_costs) or 0.0
    frontier = []
    if dearest > 0:
        for scale in FRONTIER_SCALE:
            w = scale / dearest
            choice = router.choose(chances, cost_weight=w)
            frontier.append(
                FrontierPoint(
                    w,
                    float(_picked(y_held, choice).mean()),
                    float(_picked(c_held, choice).mean()),
                )
            )
    return RouterFit(
        router=router,
        settings=settings,
        data=data,
        train_rows=tuple(train),
        heldout_rows=tuple(heldout),
        best_single=data.arms[best],
        policies=tuple(policies),
        versus_best=versus_best,
        versus_fallback=versus_fallback,
        frontier=tuple(frontier),
        fit_seconds=fit_seconds,
        route_seconds=route_seconds,
    )
