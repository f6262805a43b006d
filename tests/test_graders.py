"""The choice and math graders, the answer extractors and the grader registry.

Driven by tests/cases/grade_choice.json (letter extraction) and
tests/cases/grade_math.json (math equivalence, through real math-verify in its child
process), plus time-limit, truncation and shuffling checks.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled

from conductor import grading as graders_pkg
from conductor.errors import UsageError
from conductor.grading import GRADER_NAMES, Grader, get_grader, math_children
from conductor.grading import math as math_mod
from conductor.grading.choice import ChoiceGrader, format_choices, shuffle_choices
from conductor.grading.extract import (
    MAX_RESPONSE_CHARS,
    answer_line,
    answer_tag,
    clip_tail,
    extract_letter,
    extract_math_answer,
    last_boxed,
)
from conductor.grading.math import MathGrader, normalise_answer
from conductor.grading.types import Sample, Verdict

CASES_DIR = Path(__file__).parent / "cases"
CHOICE_CASES: list[dict[str, Any]] = json.loads(
    (CASES_DIR / "grade_choice.json").read_text(encoding="utf-8")
)
MATH_CASES: list[dict[str, Any]] = json.loads(
    (CASES_DIR / "grade_math.json").read_text(encoding="utf-8")
)

# 9^(9^(9^9)) has far too many digits to compute: sympy works on it until killed.
# (Checked with math-verify 0.9.0 / sympy 1.14: its comparison with 1 never returns.)
POWER_TOWER = r"The answer is $\boxed{9^{9^{9^{9}}}}$."


@pytest.fixture(scope="module")
def math_grader() -> MathGrader:
    # The case file describes this project's own extractor; the reference harness's
    # reading is checked against math-verify itself in test_answer_agreement.py.
    return MathGrader(timeout_s=10.0, extraction="conductor")


def _sample(gold: Any, **inputs: Any) -> Sample:
    return Sample(id="s1", input=dict(inputs), gold=gold)


# --- case files ----------------------------------------------------------------------


def test_case_files_are_well_formed() -> None:
    for cases, minimum in ((CHOICE_CASES, 25), (MATH_CASES, 35)):
        names = [c["name"] for c in cases]
        assert len(names) == len(set(names))
        assert len(cases) >= minimum
    statuses = {c["expect"] for c in MATH_CASES}
    assert statuses == {"correct", "incorrect", "no_answer"}
    assert {c["expect"] is None for c in CHOICE_CASES} == {True, False}


@pytest.mark.parametrize("case", CHOICE_CASES, ids=[c["name"] for c in CHOICE_CASES])
def test_choice_case(case: dict[str, Any]) -> None:
    assert extract_letter(case["response"], case["n_choices"]) == case["expect"]


@pytest.mark.process  # the math grader compares in child processes
@pytest.mark.parametrize("case", MATH_CASES, ids=[c["name"] for c in MATH_CASES])
def test_math_case(case: dict[str, Any], math_grader: MathGrader) -> None:
    verdict = math_grader.grade(case["response"], _sample(case["gold"]))
    assert verdict.status == case["expect"], verdict.reason


# --- extractors ----------------------------------------------------------------------


def test_last_boxed_matches_braces_and_skips_broken_boxes() -> None:
    assert last_boxed(r"\boxed{\frac{1}{\sqrt{2}}}") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"  # escaped braces are text
    assert last_boxed(r"\boxed{1} then \boxed{2} then \boxed{3") == "2"
    assert last_boxed(r"\boxed{\boxed{5}}") == r"\boxed{5}"  # the outer box
    assert last_boxed(r"\boxed 7") == "7"
    assert last_boxed(r"\fbox{x}") == "x"
    assert last_boxed("no box {here}") is None
    assert last_boxed(r"\boxed{  }") is None


def test_answer_tag_and_answer_line() -> None:
    assert answer_tag("<answer>1</answer> <ANSWER> 2 </Answer>") == "2"
    assert answer_tag("<answer>unfinished") is None
    assert answer_line("Answer: 1\nmore\n**Final Answer**: 2\n") == "2"
    assert answer_line("- answer: __x__") == "x"
    assert answer_line("Answer choices: A, B") is None
    assert answer_line("The answer is 3") is None


def test_math_answer_label_anywhere_in_the_final_paragraph() -> None:
    assert extract_math_answer("I checked it twice, so the final answer: 42.") == "42."
    assert extract_math_answer("Therefore **Final Answer:** $x = 2$") == "$x = 2$"
    # The last label of the line, and the later of a line-start label and an inline one.
    assert extract_math_answer("answer: 3, no wait, the answer: 4") == "4"
    assert extract_math_answer("Answer: 3\n\nRechecking: so the answer: 5") == "5"
    assert extract_math_answer("So the answer: 5\nAnswer: 6") == "6"
    # Only the final paragraph is read mid-line: earlier prose quoting "answer:" is not.
    assert extract_math_answer("My first answer: 7 was wrong.\n\nI am not sure now.") is None
    # A line-start label anywhere still counts, and prose without a label does not.
    assert extract_math_answer("Answer: 8\n\nThat is all.") == "8"
    assert extract_math_answer("The answer is 3") is None
    assert extract_math_answer("Answer choices: A, B") is None


def test_extract_math_answer_order() -> None:
    # <answer> beats \boxed beats ANSWER: lines, whatever their positions.
    assert extract_math_answer(r"<answer>1</answer> \boxed{2} ANSWER: 3") == "1"
    assert extract_math_answer("ANSWER: 3\n" + r"\boxed{2}") == "2"
    assert extract_math_answer("ANSWER: 3") == "3"
    assert extract_math_answer("just words") is None
    assert extract_math_answer(r"<think>\boxed{1}</think>") is None


def test_extractors_are_bounded_on_hostile_input() -> None:
    nested = r"\boxed{" * 5000 + "B" + "}" * 5000
    started = time.monotonic()
    assert extract_letter(nested, 4) == "B"
    assert last_boxed(nested) == r"\boxed{" * 4999 + "B" + "}" * 4999
    assert time.monotonic() - started < 5.0
    hostile = (
        r"\boxed{" * 50_000
        + "<answer>" * 20_000
        + "*" * 100_000
        + "\n"
        + "Answer:" * 9000
        + "\nAnswer:" * 20_000
        + "\n" * 20_000
    )
    started = time.monotonic()
    extract_letter(hostile, 4)
    extract_math_answer(hostile)
    assert time.monotonic() - started < 5.0


def test_clip_tail_keeps_the_end() -> None:
    assert clip_tail("abcdef", 3) == "def"
    assert clip_tail("abc", 10) == "abc"


def test_normalise_answer() -> None:
    assert normalise_answer(r"$\dfrac{1}{2}$") == normalise_answer(r"\frac{1}{2}")
    assert normalise_answer(r"\left( 1,\, 2 \right).") == "(1,2)"
    assert normalise_answer("-2") != normalise_answer("2")


# --- registry ------------------------------------------------------------------------


def test_registry_builds_graders_with_options() -> None:
    choice = get_grader("choice")
    assert isinstance(choice, Grader)
    assert (choice.name, choice.version) == ("choice", "3")
    grader = get_grader("math", {"timeout_s": 2.5})
    assert isinstance(grader, MathGrader)
    assert grader.timeout_s == 2.5
    assert set(GRADER_NAMES) == {"choice", "code", "math", "short"}


def test_registry_rejects_unknown_names_and_options() -> None:
    with pytest.raises(UsageError, match="choice, code, math"):
        get_grader("regex")
    with pytest.raises(UsageError, match="no option 'tolerance'.*max_chars"):
        get_grader("math", {"tolerance": 0.1})
    with pytest.raises(UsageError, match="timeout_s"):
        get_grader("math", {"timeout_s": 0})


def test_registry_reports_a_missing_grader_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(graders_pkg._REGISTRY, "ghost", (".ghost", "GhostGrader"))
    with pytest.raises(UsageError, match="not available"):
        get_grader("ghost")


# --- choice grader and shuffling -------------------------------------------------------


def test_choice_grader_verdicts() -> None:
    grader = ChoiceGrader()
    sample = _sample("C", choices=["w", "x", "y", "z", "v"])
    right = grader.grade("ANSWER: C", sample)
    assert (right.status, right.extracted, right.correct) == ("correct", "C", True)
    wrong = grader.grade("ANSWER: E", sample)  # E is valid: five choices
    assert wrong.status == "incorrect"
    assert "E" in wrong.reason and "C" in wrong.reason
    assert wrong.score == 0.0
    none = grader.grade("no idea", sample)
    assert none == Verdict("no_answer", "no answer letter could be read", detail=none.detail)
    assert grader.grade(None, sample).status == "no_answer"
    assert grader.grade("ANSWER: C", _sample("Q", choices=["a", "b"])).status == "grader_error"


def test_shuffle_choices_is_deterministic_and_tracks_gold() -> None:
    choices = ["alpha", "beta", "gamma", "delta", "epsilon"]
    first = shuffle_choices(choices, 2, seed=7, sample_id="q1")
    assert first == shuffle_choices(choices, 2, seed=7, sample_id="q1")
    shuffled, gold, permutation = first
    assert sorted(permutation) == list(range(5))
    assert shuffled == [choices[i] for i in permutation]
    assert shuffled["ABCDE".index(gold)] == "gamma"
    # Other seeds / ids give other orders (at least for some of them).
    orders = {
        tuple(shuffle_choices(choices, 0, seed, f"q{i}")[2]) for seed in range(3) for i in range(5)
    }
    assert len(orders) > 5
    for index in range(5):
        _shuffled, letter, _perm = shuffle_choices(choices, index, seed=1, sample_id="x")
        assert _shuffled["ABCDE".index(letter)] == choices[index]
    with pytest.raises(ValueError):
        shuffle_choices(choices, 5, seed=1, sample_id="x")


def test_format_choices() -> None:
    assert format_choices(["red", " blue "]) == "A) red\nB) blue"


# --- math grader: limits -------------------------------------------------------------


@pytest.mark.process  # the math grader compares in child processes
def test_math_grader_without_answer_or_gold(math_grader: MathGrader) -> None:
    assert math_grader.grade(None, _sample("1")).status == "no_answer"
    verdict = math_grader.grade(r"\boxed{1}", _sample(""))
    assert verdict.status == "grader_error"
    verdict = math_grader.grade(r"\boxed{1}", _sample(r"\frac{"))
    assert verdict.status == "grader_error"
    assert "could not be read" in verdict.reason


@pytest.mark.process  # the math grader compares in child processes
def test_math_time_limit_from_a_worker_thread(math_grader: MathGrader) -> None:
    grader = MathGrader(timeout_s=1.0)
    # Use a child first (plain numbers never do) so that the child taken next is known.
    assert grader.grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt2")).status == "correct"
    idle = list(math_mod._POOL._idle)
    assert idle, "a warm child should be waiting"
    taken = idle[-1]  # the pool hands out its most recently used child

    results: list[Verdict] = []
    thread = threading.Thread(
        target=lambda: results.append(grader.grade(POWER_TOWER, _sample("1")))
    )
    started = time.monotonic()
    thread.start()
    thread.join(timeout=30)
    elapsed = time.monotonic() - started
    assert results and results[0].status == "time_limit", results
    # The parent gave up at its time limit instead of waiting for the comparison, which
    # takes minutes; the margin is for a busy machine, not a measure of speed.
    assert elapsed < 1.0 + 10.0
    # The stuck child was killed, and the next comparison gets a working one.
    assert taken.process.poll() is not None
    assert taken not in math_mod._POOL._idle
    assert grader.grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt2")).status == "correct"


@pytest.mark.process
async def test_math_time_limit_under_asyncio_to_thread() -> None:
    grader = MathGrader(timeout_s=1.0)
    grader.grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt2"))  # warm
    started = time.monotonic()
    verdict = await asyncio.to_thread(grader.grade, POWER_TOWER, _sample("1"))
    assert verdict.status == "time_limit"
    assert time.monotonic() - started < 1.0 + 2.0


@pytest.mark.process
def test_math_grader_replaces_a_dead_child_and_serves_threads(math_grader: MathGrader) -> None:
    math_grader.grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt2"))  # warm
    victim = math_mod._POOL._idle[-1]
    victim.process.kill()
    victim.process.wait(timeout=10)
    assert math_grader.grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt2")).status == "correct"
    # More threads than children: each one still gets its own, correct verdict.
    pairs = [(r"\frac{1}{4}", "0.25"), ("3", "-3"), (r"\sqrt{9}", "3"), ("0.2", r"\frac15")]
    results: dict[int, str] = {}

    def grade(index: int) -> None:
        answer, gold = pairs[index]
        results[index] = math_grader.grade(f"ANSWER: {answer}", _sample(gold)).status

    threads = [threading.Thread(target=grade, args=(i,)) for i in range(len(pairs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {0: "correct", 1: "incorrect", 2: "correct", 3: "correct"}


def test_megabyte_response_is_truncated_and_graded_quickly(math_grader: MathGrader) -> None:
    filler = "Let me keep checking the arithmetic. " * 30_000  # about 1.1 MB
    response = r"Early guess \boxed{99}. " + filler + r"So the answer is $\boxed{\frac{3}{4}}$."
    assert len(response) > 1_000_000
    started = time.monotonic()
    verdict = math_grader.grade(response, _sample("0.75"))
    assert verdict.status == "correct"
    assert verdict.detail.get("truncated") is True
    assert time.monotonic() - started < 5.0
    # The early box is outside the kept tail: with the final box gone, nothing is read.
    assert (
        math_grader.grade(
            response[: -len(r"So the answer is $\boxed{\frac{3}{4}}$.")], _sample("99")
        ).status
        == "no_answer"
    )
    letter = ChoiceGrader().grade(
        "ANSWER: A\n" + filler + "ANSWER: B", _sample("B", choices=list("abcd"))
    )
    assert letter.status == "correct"
    assert len(clip_tail(response)) == MAX_RESPONSE_CHARS


# --- plain numbers in process, warm children -----------------------------------------


def test_plain_number_reads_only_plain_numbers() -> None:
    from fractions import Fraction

    plain = math_mod.plain_number
    assert plain("42") == (Fraction(42), True)
    assert plain("$-0.5$.") == (Fraction(-1, 2), False)
    assert plain(r"\dfrac{3}{4}") == (Fraction(3, 4), False)
    assert plain(r"-\frac34") == (Fraction(-3, 4), False)
    assert plain("6/8") == (Fraction(3, 4), False)
    for text in ("1,000", r"10\%", "1e3", "x=3", r"\sqrt{2}", "1/0", r"\frac{-1}{2}", "3.1.4", ""):
        assert plain(text) is None, text


NUMERIC_PAIRS = [
    (answer, gold)
    for gold in ("0", "7", "-7", "0.5", "1/3", "2.25", "100", r"\frac{9}{4}", "1000000")
    for answer in (
        "0",
        "7",
        "-7",
        "007",
        "7.0",
        "0.5",
        ".5",
        "1/2",
        "0.3333333",
        "0.333",
        "0.34",
        "2.25",
        "9/4",
        "2.2500001",
        "100",
        "100.0004",
        "99",
        "1000001",
        "1000000.0",
    )
]


def test_numeric_fast_path_agrees_with_math_verify() -> None:
    """Every pair the in-process path decides gets math-verify's own verdict."""
    decided = 0
    for answer, gold in NUMERIC_PAIRS:
        settled = math_mod._numeric_verdict([gold], answer)
        if settled is None:
            continue
        decided += 1
        # math-verify in this process (the grader's children run the same function).
        reference = math_children._compare([gold], answer)
        assert settled[0] == reference["equal"], (answer, gold, reference)
    assert decided >= len(NUMERIC_PAIRS) * 3 // 4


def test_plain_numbers_are_graded_without_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a plain number went to a child process")

    grader = MathGrader(warm=False, extraction="conductor")
    monkeypatch.setattr(math_mod._POOL, "ask", no_child)
    checks = [
        ("ANSWER: 0.75", "3/4", "correct"),
        (r"\boxed{12}", "13", "incorrect"),
        ("So the answer: 1/2.", r"\frac{1}{2}", "correct"),
        ("ANSWER: 2.5", "2", "incorrect"),
    ]
    for response, gold, expected in checks:
        verdict = grader.grade(response, _sample(gold))
        assert verdict.status == expected, verdict.reason
        assert verdict.detail["method"] in ("exact", "numeric")


@pytest.mark.process
def test_building_the_grader_starts_children_before_any_answer() -> None:
    pool = math_children.ChildPool(2)
    monkey_pool = math_mod._POOL
    math_mod._POOL = pool
    try:
        MathGrader()
        deadline = time.monotonic() + scaled(120)
        while len(pool._idle) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pool._idle) == 2, "both children should be warm without a comparison"
        children = list(pool._idle)
        # The first comparison takes a warm child instead of starting one.
        verdict = MathGrader(warm=False).grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt{2}"))
        assert verdict.status == "correct"
        assert set(pool._idle) == set(children)
        # Warming again never goes past the limit.
        pool.warm()
        assert pool._alive == 2 and len(pool._idle) == 2
    finally:
        math_mod._POOL = monkey_pool
        pool.close()


@pytest.mark.process
def test_a_child_that_cannot_start_is_a_grader_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # E.g. an interpreter under a private home directory, graded as another user.
    monkeypatch.setattr(math_mod, "_POOL", math_children.ChildPool(2))
    monkeypatch.setattr(math_children.sys, "executable", "/nonexistent/python3")
    grader = MathGrader(extraction="conductor")  # warming fails quietly in the background
    verdict = grader.grade(r"\boxed{\sqrt{8}}", _sample(r"2\sqrt{2}"))
    assert verdict.status == "grader_error"
    assert "cannot start the comparison process (/nonexistent/python3)" in verdict.reason
    # With this project's extraction, plain numbers need no child at all.
    assert grader.grade("ANSWER: 0.5", _sample("1/2")).status == "correct"
    math_mod._POOL.close()
