"""The view's statistics against cases worked out by hand."""

from __future__ import annotations

import math

import pytest

from conductor.runs.stats import (
    mcnemar_exact,
    mean_interval,
    paired_bootstrap_diff,
    pareto_front,
    percentile,
    wilson_interval,
)


def test_wilson_8_of_20() -> None:
    # p = 0.4, z^2 = 3.8416, n = 20; denominator 1 + 3.8416/20 = 1.19208
    # centre = (0.4 + 3.8416/40) / 1.19208 = 0.49604 / 1.19208 = 0.416113...
    # half   = 1.96 * sqrt(0.4*0.6/20 + 3.8416/1600) / 1.19208
    #        = 1.96 * sqrt(0.014401) / 1.19208 = 0.235208 / 1.19208 = 0.197309...
    lo, hi = wilson_interval(8, 20)
    assert lo == pytest.approx(0.416113 - 0.197309, abs=1e-5)  # 0.218804
    assert hi == pytest.approx(0.416113 + 0.197309, abs=1e-5)  # 0.613422


def test_wilson_at_the_ends() -> None:
    # 0/10: centre = half = (3.8416/20) / 1.38416 = 0.19208 / 1.38416 = 0.138770
    assert wilson_interval(0, 10) == (0.0, pytest.approx(2 * 0.19208 / 1.38416))
    # 10/10 mirrors it.
    assert wilson_interval(10, 10) == (pytest.approx(1 - 2 * 0.19208 / 1.38416), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_mcnemar_by_hand() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    # n = 7, min = 1: 2 * (C(7,0) + C(7,1)) / 2^7 = 2 * 8 / 128 = 0.125
    assert mcnemar_exact(1, 6) == pytest.approx(0.125)
    assert mcnemar_exact(6, 1) == pytest.approx(0.125)
    # n = 12, min = 2: 2 * (1 + 12 + 66) / 4096 = 158 / 4096 = 0.03857421875
    assert mcnemar_exact(10, 2) == pytest.approx(0.03857421875)
    # n = 6, min = 3: 2 * (1 + 6 + 15 + 20) / 64 = 1.3125, capped at 1
    assert mcnemar_exact(3, 3) == 1.0
    # Far past a float's 2^1024: still a probability, and tiny.
    assert 0.0 <= mcnemar_exact(0, 5000) < 1e-300
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_mean_interval_is_deterministic_and_holds_the_mean() -> None:
    values = [0.001 * (i % 7) + (0.05 if i % 11 == 0 else 0.0) for i in range(200)]
    first = mean_interval(values, seed=3)
    assert mean_interval(values, seed=3) == first
    mean, lo, hi = first
    assert mean == pytest.approx(math.fsum(values) / len(values))
    assert lo < mean < hi
    assert mean_interval(values, seed=4) != first  # the seed is used
    # A wider confidence gives a wider interval on the same draws.
    _, lo99, hi99 = mean_interval(values, 0.99, seed=3)
    assert lo99 <= lo and hi99 >= hi
    assert mean_interval([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    assert mean_interval([2.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        mean_interval([])


def test_paired_bootstrap_diff() -> None:
    same = [True, False, True, True, False]
    assert paired_bootstrap_diff(same, same) == (0.0, 0.0, 0.0)
    a = [True] * 30 + [False] * 10
    b = [True] * 20 + [False] * 20
    diff, lo, hi = paired_bootstrap_diff(a, b, seed=1)
    assert diff == pytest.approx(0.25)  # 30/40 - 20/40
    assert lo < diff < hi
    assert lo > 0  # A is right on every question B is, and on ten more
    assert paired_bootstrap_diff(a, b, seed=1) == (diff, lo, hi)
    # Swapping the runs mirrors the interval (the same questions are drawn).
    assert paired_bootstrap_diff(b, a, seed=1) == pytest.approx((-diff, -hi, -lo))
    with pytest.raises(ValueError):
        paired_bootstrap_diff([True], [True, False])


def test_pareto_front() -> None:
    pts = [(1.0, 0.5), (2.0, 0.7), (1.5, 0.4), (3.0, 0.7), (0.5, 0.2), (2.0, 0.7)]
    # (1.5, 0.4) is beaten by (1.0, 0.5); (3.0, 0.7) by (2.0, 0.7); the two (2.0, 0.7)
    # are equal, so neither dominates the other.
    assert pareto_front(pts) == [4, 0, 1, 5]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 0.3)]) == [0]


def test_percentile() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    # 0.95 * (5 - 1) = 3.8: 4 + 0.8 * (5 - 4)
    assert percentile([5.0, 1.0, 2.0, 3.0, 4.0], 0.95) == pytest.approx(4.8)
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError):
        percentile([1.0], 50)
