"""The statistics of bench runs' scores: the intervals and tests of ``conductor view``,
its static charts and the reports (JUnit, Markdown).

Proportions and differences are fractions in [0, 1] (not percentages).  Every
resampling function takes a ``seed`` and draws from its own numpy
:class:`~numpy.random.Generator` (PCG64), so the same inputs give the same interval on
every run and machine.  numpy is imported only when a bootstrap runs: the CLI's start
(``conductor --help``) must not pay for it, and only ``conductor view`` and the charts
(the ``view`` extra) resample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .summary import percentile as summary_percentile

__all__ = [
    "mcnemar_exact",
    "mean_interval",
    "paired_bootstrap_diff",
    "pareto_front",
    "percentile",
    "wilson_interval",
]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (``q`` in [0, 1]: 0.5 is the median) of ``values``, by linear
    interpolation between closest ranks (numpy's default); ``None`` for no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile: q must be in [0, 1], not {q!r}")
    return summary_percentile(sorted(values), q)


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval for ``k`` successes in ``n`` trials (z = 1.96: 95%).

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0/n or
    n/n.  With no trials every proportion is possible: ``(0.0, 1.0)``.
    """
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"wilson_interval: need 0 <= k <= n, not k={k}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At 0/n and n/n the bound is exactly 0 or 1; rounding must not move it past.
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return (lo, hi)


#: How many indices one block of bootstrap draws holds.
_BLOCK = 1 << 22


def _bootstrap(
    values: Sequence[float], confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """(mean, lo, hi): the percentile bootstrap of the mean of ``values``."""
    if not values:
        raise ValueError("a bootstrap needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples!r}")
    data = list(values)
    n = len(data)
    mean = math.fsum(data) / n
    if all(v == data[0] for v in data):
        # Every resample is the same; no draws needed, and no rounding noise either.
        return (mean, mean, mean)
    import numpy as np

    array = np.asarray(data, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    # The resamples' indices are drawn a block of rows at a time (about 4 Mi indices,
    # 16 MB): 2,000 resamples of 100,000 values at once would take 1.6 GB.
    rows = max(1, _BLOCK // n)
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        picks = rng.integers(0, n, size=(k, n), dtype=np.int64 if n > 2**31 - 1 else np.int32)
        means[start : start + k] = array[picks].sum(axis=1) / n
    tail = (1.0 - confidence) / 2.0
    # numpy's default quantile (linear between closest ranks) is :func:`percentile`'s.
    lo, hi = (float(x) for x in np.quantile(means, [tail, 1.0 - tail]))
    return (mean, lo, hi)


def mean_interval(
    values: Sequence[float], confidence: float = 0.95, *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, lo, hi) of ``values`` with a percentile-bootstrap interval: for cost per
    question, whose distribution is skewed (a few long workflows cost the most)."""
    return _bootstrap(values, confidence, resamples, seed)


def paired_bootstrap_diff(
    a: Sequence[bool],
    b: Sequence[bool],
    *,
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """(accuracy(A) - accuracy(B), lo, hi) for two runs graded on the same questions
    (``a[i]`` and ``b[i]`` are question i): the questions are resampled as pairs, so
    what both runs find hard does not widen the interval."""
    if len(a) != len(b):
        raise ValueError(f"paired runs must cover the same questions ({len(a)} != {len(b)})")
    # Resampling the pairs is resampling their differences (-1, 0 or 1).
    diffs = [float(bool(x)) - float(bool(y)) for x, y in zip(a, b, strict=True)]
    return _bootstrap(diffs, confidence, resamples, seed)


def mcnemar_exact(b: int, c: int) -> float:
    """McNemar's exact test: the two-sided p-value that two runs are equally accurate,
    from the discordant questions only (``b``: only A right, ``c``: only B right).

    Under the null each discordant question is a fair coin, so the p-value is twice the
    binomial(b + c, 1/2) tail at min(b, c), capped at 1.
    """
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: counts must not be negative, not b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    # Integer arithmetic to the last step: 2**n overflows a float long before n = 10,000.
    return min(1.0, 2 * tail / (1 << n))


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the ``(cost, accuracy)`` points no other point dominates (one
    dominates another when it costs no more and is no less accurate, and is better in
    one of the two), ordered by cost (ties: the more accurate first, then by index):
    the order the frontier is drawn in."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], i))
    front: list[int] = []
    best = -math.inf
    for i in order:
        cost, acc = points[i]
        if acc > best:
            front.append(i)
            best = acc
        elif acc == best and front and points[front[-1]] == (cost, acc):
            front.append(i)  # an exact duplicate of a frontier point is not dominated
    return front
