"""The router's head: for each arm (a worker, or a short fixed workflow), the chance it
answers a question right, from the question's features.

One L2-regularised logistic regression per arm, fitted together by accelerated gradient
descent on the mean cross-entropy (a sample's score may be a fraction: the mean over its
epochs).  Each arm's bias starts at the logit of its accuracy on the training questions
and is not penalised, and the weights start at zero, so a strongly regularised head
predicts each arm's overall accuracy: where the features say nothing, the router
falls back to the best single arm instead of to noise.  The penalty is chosen by
k-fold cross-validation on the training questions (:func:`fit_head`).

numpy only: a head for a few hundred questions and 4,096 features fits in well under a
second on two cores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ITERATIONS", "PENALTIES", "LogisticHead", "fit_head", "fold_numbers"]

#: The L2 penalties cross-validation chooses from (per question, on unit-length rows).
PENALTIES: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: Scores are clipped this far from 0 and 1 before taking a logit.
_EPS = 1e-3
#: The descent stops once no gradient component is larger (the chances are then within
#: about 1e-4 of the optimum's; tests/test_router.py checks them against scikit-learn).
_TOLERANCE = 1e-7
#: The most descent steps at one penalty.
ITERATIONS = 3000


@dataclass(frozen=True)
class LogisticHead:
    """Weights ``(dim, arms)`` and biases ``(arms,)``: ``sigmoid(x @ weights + bias)``."""

    weights: np.ndarray
    bias: np.ndarray
    penalty: float

    @property
    def arms(self) -> int:
        return int(self.bias.shape[0])

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(n, arms)`` chances of a right answer for ``(n, dim)`` features."""
        return _sigmoid(features @ self.weights + self.bias)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0))))


def _logit(p: np.ndarray) -> np.ndarray:
    import numpy as np

    q = np.clip(p, _EPS, 1.0 - _EPS)
    return np.asarray(np.log(q / (1.0 - q)))


def _accelerated(
    logits: Callable[[np.ndarray], np.ndarray],
    back: Callable[[np.ndarray], np.ndarray],
    size: int,
    top: float,
    y: np.ndarray,
    penalty: float,
    iterations: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Nesterov's accelerated gradient (step 1/L) on the mean cross-entropy plus the L2
    penalty, for parameters ``p`` of ``size`` rows whose logits are ``logits(p)`` plus
    the bias and whose loss gradient is ``back(error) / n``; ``top`` is the largest
    eigenvalue of the map.  Returns ``(p, bias)``."""
    import numpy as np

    n = y.shape[0]
    step = _step(top, n, penalty)
    p = np.zeros((size, y.shape[1]))
    b = _logit(y.mean(axis=0))
    p_prev, b_prev = p, b
    t = 1
    for _ in range(iterations):
        momentum = (t - 1) / (t + 2)
        p_look = p + momentum * (p - p_prev)
        b_look = b + momentum * (b - b_prev)
        err = _sigmoid(logits(p_look) + b_look) - y
        grad_p = back(err) / n + penalty * p_look
        grad_b = err.mean(axis=0)
        if max(float(np.abs(grad_p).max()), float(np.abs(grad_b).max())) < _TOLERANCE:
            return p_look, b_look
        p_prev, b_prev = p, b
        p = p_look - step * grad_p
        b = b_look - step * grad_b
        # Momentum that points uphill is dropped (O'Donoghue and Candes's gradient
        # restart): on a strongly convex loss, as a small penalty leaves it, plain
        # Nesterov oscillates and creeps; restarted, it converges linearly.
        if float((grad_p * (p - p_prev)).sum() + (grad_b * (b - b_prev)).sum()) > 0:
            t = 1
            p_prev, b_prev = p, b
        else:
            t += 1
    return p, b


def _descend(
    gram: np.ndarray, y: np.ndarray, penalty: float, iterations: int
) -> tuple[np.ndarray, np.ndarray]:
    """The descent in the span of the training rows: the weights are ``x.T @ a`` (they
    start at zero and every gradient step adds rows of ``x``; ``w - s (x.T err / n +
    penalty w)`` is ``x.T`` of ``a - s (err / n + penalty a)``), so only the Gram matrix
    ``x @ x.T`` is needed, ``n`` by ``n`` however many features there are.  Returns
    ``(a, bias)``."""
    n = gram.shape[0]
    top = _top_eigenvalue(lambda v: gram @ v, n)
    return _accelerated(lambda a: gram @ a, lambda err: err, n, top, y, penalty, iterations)


def _fit(x: np.ndarray, y: np.ndarray, penalty: float, iterations: int) -> LogisticHead:
    """One head at one penalty: in the rows' span (:func:`_descend`) while there are
    fewer questions than features, else in the features themselves."""
    n, dim = x.shape
    if n <= dim:
        a, b = _descend(x @ x.T, y, penalty, iterations)
        return LogisticHead(weights=x.T @ a, bias=b, penalty=penalty)
    top = _top_eigenvalue(lambda v: x.T @ (x @ v), dim)
    w, b = _accelerated(lambda w: x @ w, lambda err: x.T @ err, dim, top, y, penalty, iterations)
    return LogisticHead(weights=w, bias=b, penalty=penalty)


def _step(top: float, n: int, penalty: float) -> float:
    """1 / L, L bounding the gradient's Lipschitz constant: the features' part (their
    largest eigenvalue ``top`` / 4n), the bias's (a feature of ones: n / 4n) and the
    penalty's; 10% over, as the power iteration finds ``top`` from below."""
    return 1.0 / (1.1 * (top + n) / (4.0 * n) + penalty)


def _top_eigenvalue(apply: Callable[[np.ndarray], np.ndarray], size: int) -> float:
    """The largest eigenvalue of a positive semi-definite matrix given as a product
    (power iteration: closely enough for a step size, which a little short only slows)."""
    import numpy as np

    v = np.ones(size) / np.sqrt(size)
    top = 0.0
    for _ in range(30):
        u = apply(v)
        top = float(np.linalg.norm(u))
        if top == 0.0:
            break
        v = u / top
    return top


def fold_numbers(n: int, k: int, seed: int) -> np.ndarray:
    """Each of ``n`` questions' fold, 0 to ``k - 1``: the folds as even as they can be,
    the questions shuffled into them by ``seed``."""
    import numpy as np

    fold_of = np.empty(n, dtype=int)
    fold_of[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
    return fold_of


def _question_losses(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each question's log loss, the mean over the arms."""
    import numpy as np

    q = np.clip(p, _EPS, 1.0 - _EPS)
    return np.asarray(-(y * np.log(q) + (1.0 - y) * np.log(1.0 - q)).mean(axis=1))


def _one_standard_error(penalties: Sequence[float], losses: np.ndarray) -> float:
    """The largest penalty whose mean out-of-fold loss is within one standard error of
    the lowest (``losses``: a row of per-question losses for each penalty), as glmnet's
    ``lambda.1se`` chooses: among heads that cross-validation cannot tell apart, the
    simplest.  On a few hundred questions the lowest loss often falls at the smallest
    penalty by chance, and a head that fits that closely follows noise when it routes."""
    import numpy as np

    means = losses.mean(axis=1)
    best = int(np.argmin(means))
    se = float(losses[best].std(ddof=1) / np.sqrt(losses.shape[1])) if losses.shape[1] > 1 else 0.0
    within = [p for p, m in zip(penalties, means, strict=True) if m <= means[best] + se]
    return max(within)


def fit_head(
    features: np.ndarray,
    scores: np.ndarray,
    *,
    penalties: Sequence[float] = PENALTIES,
    folds: int = 5,
    iterations: int = ITERATIONS,
    seed: int = 0,
) -> LogisticHead:
    """A head fitted on ``(n, dim)`` features and ``(n, arms)`` scores in [0, 1], its
    penalty chosen by cross-validated log loss (:func:`_one_standard_error`; the largest
    penalty when there are too few questions to fold)."""
    import numpy as np

    n = features.shape[0]
    if n == 0:
        raise ValueError("no questions to fit a router on")
    chosen = max(penalties)
    k = min(folds, n)
    if k >= 2 and len(penalties) > 1:
        fold_of = fold_numbers(n, k, seed)
        dual = n <= features.shape[1]
        gram = features @ features.T if dual else None
        # Each question's out-of-fold log loss at each penalty.
        losses = np.zeros((len(penalties), n))
        for i, penalty in enumerate(penalties):
            for f in range(k):
                train, test = fold_of != f, fold_of == f
                if gram is not None:
                    a, b = _descend(gram[np.ix_(train, train)], scores[train], penalty, iterations)
                    chances = _sigmoid(gram[np.ix_(test, train)] @ a + b)
                else:
                    head = _fit(features[train], scores[train], penalty, iterations)
                    chances = head.predict(features[test])
                losses[i, test] = _question_losses(chances, scores[test])
        chosen = _one_standard_error(penalties, losses)
    return _fit(features, scores, chosen, iterations)
