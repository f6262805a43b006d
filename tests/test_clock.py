"""The tests' own clock (:mod:`kit.clock`): limits on child processes scale with how
slow this machine runs Python now, never below what they say, and CI's judgement of the
fast subset's time is the budget times that factor times the slack."""

from __future__ import annotations

import pytest
from kit import clock


def test_the_unit_of_work_is_fixed() -> None:
    assert clock.unit() == clock.unit()


def test_a_limit_is_never_tightened_and_grows_with_the_slowdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(clock, "_measured", None)
    monkeypatch.setattr(clock, "measure", lambda runs=5: 0.25)  # a faster machine
    assert clock.scaled(60) == 60
    monkeypatch.setattr(clock, "_measured", None)
    monkeypatch.setattr(clock, "measure", lambda runs=5: 7.5)  # a busy one
    assert clock.scaled(60) == 450


def test_the_factor_is_measured_again_once_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    factors = iter([2.0, 3.0])
    monkeypatch.setattr(clock, "_measured", None)
    monkeypatch.setattr(clock.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(clock, "measure", lambda runs=5: next(factors))
    assert clock.slowdown() == 2.0
    now[0] += clock.FRESH_S / 2
    assert clock.slowdown() == 2.0  # still fresh: not measured again
    now[0] += clock.FRESH_S
    assert clock.slowdown() == 3.0


def test_the_measure_is_the_median_wall_time_over_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wall time, not CPU time: a process given a sixth of a core by a busy machine
    takes six times as long, and so does a limit scaled by it."""
    ref = clock.REFERENCE_S
    took = iter([ref, ref * 6, ref * 5, ref * 40, ref * 6])  # one spike, ignored
    clocks = iter(t for d in took for t in (0.0, d))
    monkeypatch.setattr(clock.time, "perf_counter", lambda: next(clocks))
    monkeypatch.setattr(clock, "unit", lambda: 0)
    assert clock.measure(runs=5) == pytest.approx(6.0)


def test_ci_judges_the_fast_subset_against_the_budget_times_the_factor() -> None:
    budget = clock.FAST_SUBSET_BUDGET_S
    ok, line = clock.judge(budget * 2 * 1.4, factor=2.0)
    assert ok and "within it" in line
    ok, line = clock.judge(budget * 2 * 1.6, factor=2.0)
    assert not ok and "OVER IT" in line
    # a faster machine gets a shorter budget (the factor is not clamped here)
    assert not clock.judge(budget, factor=0.5)[0]


def test_the_judge_uses_the_slower_of_the_two_measures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(clock, "measure", lambda runs=5: 1.0)
    took = str(clock.FAST_SUBSET_BUDGET_S * 2)  # over 1.5x at 1.0, within at 2.0
    assert clock.main(["--judge", took]) == 1
    assert clock.main(["--judge", took, "--before", "2.0"]) == 0
    assert "OVER IT" in capsys.readouterr().out
