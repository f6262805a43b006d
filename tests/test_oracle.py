"""The per-question oracle has one definition (:mod:`conductor.runs.oracle`), and
``report``, ``view`` and ``fit-router`` give the same figure for the same runs, epochs
included: two single workers each right on one of two epochs of every question make an
oracle of 50% (what a router choosing one of them per question scores), not 100%."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.poolkit import invoke_cli
from kit.records import record, round_of, write_run

from conductor.runs.oracle import (
    oracle_of_runs,
    oracle_picks,
    question_oracle,
    question_score,
    unit_score,
)
from conductor.view.data import load_runs
from conductor.view.page import question_ceiling


def _singles(tmp_path: Path, n: int = 30) -> list[Path]:
    """Two ``single:`` runs of 2 epochs: ``alpha`` right on epoch 0 of every question,
    ``beta`` on epoch 1 (each alone 50%; on no question is either better)."""
    dirs = []
    for worker, right_epoch in ((0, 0), (1, 1)):
        recs = [
            record(
                f"s{i}",
                epoch,
                "correct" if epoch == right_epoch else "incorrect",
                [round_of(0, [(worker, [])], tries=0)],
                wall=1.0,
                cost=0.001 * (worker + 1),
            )
            for i in range(n)
            for epoch in (0, 1)
        ]
        name = ("alpha", "beta")[worker]
        dirs.append(write_run(tmp_path / f"single-{name}", f"single:{name}", recs, epochs=2))
    return dirs


def test_two_epochs_give_one_oracle_in_report_view_and_fit_router(tmp_path: Path) -> None:
    dirs = _singles(tmp_path)

    shown = invoke_cli("report", *map(str, dirs))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "per-question oracle: 50.0% of the 30 questions" in text, shown.stdout
    assert "(the best alone: 50.0%)" in text

    # What `conductor view`'s chart draws its line at (and `report --plot`'s).
    assert question_ceiling(load_runs(dirs)) == pytest.approx(0.5)

    pytest.importorskip("numpy")
    fitted = invoke_cli("fit-router", *map(str, dirs), "--out", str(tmp_path / "router"), "--json")
    assert fitted.returncode == 0, fitted.stderr
    policies = {p["name"]: p for p in json.loads(fitted.stdout)["policies"]}
    assert policies["oracle"]["accuracy"] == pytest.approx(0.5)


def test_one_epoch_oracle_is_any_single_right(tmp_path: Path) -> None:
    """With one epoch the mean is the one score: a question is the oracle's when some
    single got it right (the reading the README gives)."""
    recs = {
        name: [
            record(
                f"s{i}",
                0,
                "correct" if i % 2 == w else "incorrect",
                [round_of(0, [(w, [])], tries=0)],
                wall=1.0,
            )
            for i in range(6)
        ]  # fmt: skip
        for w, name in enumerate(("alpha", "beta"))
    }
    dirs = [write_run(tmp_path / f"single-{n}", f"single:{n}", r) for n, r in recs.items()]
    assert question_ceiling(load_runs(dirs)) == 1.0
    shown = invoke_cli("report", *map(str, dirs))
    assert "per-question oracle: 100.0% of the 6 questions" in " ".join(shown.stdout.split())


def test_an_arms_score_on_a_question_is_its_mean_over_epochs() -> None:
    assert question_score({0: 1.0, 1: 0.0}) == 0.5
    assert question_score({3: 1.0}) == 1.0
    with pytest.raises(ValueError):
        question_score({})


def test_the_oracle_picks_the_best_then_the_cheaper_then_the_first() -> None:
    scores = [[0.5, 1.0], [0.5, 0.5], [0.5, 0.5], [0.0, 0.0]]
    costs = [[1.0, 9.0], [2.0, 1.0], [1.0, 1.0], [3.0, 2.0]]
    assert oracle_picks(scores, costs) == [1, 1, 0, 1]
    assert oracle_picks(scores) == [1, 0, 0, 0]


def test_question_oracle_and_best_single() -> None:
    got = question_oracle(("a", "b"), [[1.0, 0.0], [0.5, 1.0], [0.0, 0.0]])
    assert got.accuracy == pytest.approx(2 / 3)
    assert got.best_single == pytest.approx(0.5)
    assert (got.questions, got.arms) == (3, ("a", "b"))


def test_runs_oracle_counts_only_questions_every_arm_answered() -> None:
    runs = {
        "a": {"q1": {0: 1.0, 1: 0.0}, "q2": {0: 1.0}, "only-a": {0: 1.0}},
        "b": {"q1": {0: 0.0, 1: 0.0}, "q2": {0: 0.0}},
    }
    got = oracle_of_runs(runs)
    assert got is not None and got.questions == 2
    assert got.accuracy == pytest.approx((0.5 + 1.0) / 2)
    assert oracle_of_runs({"a": runs["a"]}) is None  # one arm: nothing to choose
    assert oracle_of_runs({"a": {"x": {0: 1.0}}, "b": {"y": {0: 1.0}}}) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1.0), (0.25, 0.25), (None, 0.0), (True, 0.0), ("1", 0.0), (float("nan"), 0.0),
     (2.0, 1.0), (-1.0, 0.0)],
)  # fmt: skip
def test_a_score_is_read_as_a_number_in_0_to_1(value: object, expected: float) -> None:
    assert unit_score(value) == expected
