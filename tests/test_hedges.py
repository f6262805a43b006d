"""Graders refuse hedges (issue 37): an answer that names several options is wrong.

One rule, shared by the short-answer, choice and math graders
(:func:`conductor.grading.extract.hedge_in`): "yes or no", "A/B", "3 or 4", boxes that
disagree ... are ``incorrect`` whichever option the gold is, while one option stated
with words around it ("yes, or at least most likely", "the answer is B (not A)", "3,
or equivalently 3.0", "x = 3 or x = -3" against the gold set {3, -3}) is graded as it
was before the rule.

Each hedge is graded against every option it names and must be wrong for each.  The
positive control grades the same hedges with the wall removed (each grader's hedge check
replaced by a no-op) and shows that they were credited, so these tests can fail.  The
near-misses are graded the same with and without the wall.  The gold answers of the
shipped short-answer benchmarks and of the math cases, written out verbatim, are graded
the same with and without it (none changes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conductor.grading import choice as choice_mod
from conductor.grading import get_grader
from conductor.grading import short as short_mod
from conductor.grading.extract import (
    MAX_RESPONSE_CHARS,
    Part,
    answer_places,
    hedge_in,
    letter_options,
    named_options,
)
from conductor.grading.math import MathGrader, math_options
from conductor.grading.types import Sample, Verdict

ROOT = Path(__file__).resolve().parents[1]
EXTRACTIONS = ("official", "conductor")
FOUR = ["w", "x", "y", "z"]


@contextmanager
def _wall_removed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The positive control: every grader's hedge check made a no-op."""
    with monkeypatch.context() as patch:
        patch.setattr(short_mod, "_hedged", lambda *args: None)
        patch.setattr(choice_mod, "hedge_in", lambda *args, **kwargs: None)
        patch.setattr(MathGrader, "_refuse_hedge", lambda self, golds, body, verdict: verdict)
        yield


def _grade(grader: str, extraction: str | None, gold: Any, response: str) -> Verdict:
    options: dict[str, Any] = {} if extraction is None else {"extraction": extraction}
    inputs: dict[str, Any] = {"choices": FOUR} if grader == "choice" else {}
    built = get_grader(grader, options)
    return built.grade(response, Sample(id="s", input=inputs, gold=gold))


# --- the hedges ----------------------------------------------------------------------

# (the options the reply names, the reply): each option as a gold must grade it wrong.
SHORT_HEDGES: list[tuple[tuple[str, ...], str]] = [
    (("yes", "no"), "ANSWER: yes or no"),
    (("yes", "no"), "ANSWER: no or yes"),
    (("yes", "no"), "ANSWER: yes/no"),
    (("yes", "no"), "ANSWER: Yes / No"),
    (("yes", "no"), "ANSWER: both yes and no"),
    (("yes", "no"), "ANSWER: yes and no"),
    (("yes", "no"), "ANSWER: either yes or no"),
    (("yes", "no"), "ANSWER: yes, no"),
    (("yes", "no"), "ANSWER: yes; no"),
    (("yes", "no"), "ANSWER: yes & no"),
    (("yes", "no"), "ANSWER: yes|no"),
    (("yes", "no"), "ANSWER: Yes. No."),
    (("yes", "no"), "ANSWER: Yes! Or no."),
    (("yes", "no"), "ANSWER: yes (or no)"),
    (("yes", "no"), "ANSWER: yes or maybe no"),
    (("yes", "no"), "ANSWER: yes, unless it is no"),
    (("yes", "no"), "ANSWER: YES OR NO"),
    (("yes", "no"), "ANSWER: **yes** or **no**"),
    (("yes", "no"), "ANSWER: not sure: yes or no"),
    (("yes", "no"), "ANSWER: yes - no"),
    (("yes", "no"), "The answer is yes or no."),
    (("yes", "no"), "yes no"),
    (("yes", "no"), "<answer>yes\nno</answer>"),
    (("yes", "no"), "ANSWER: \\boxed{yes} or \\boxed{no}"),
    (("yes", "no"), "I say \\boxed{yes}.\n\nOn reflection, \\boxed{no}."),
    (("true", "false"), "ANSWER: true or false"),
    (("3", "4"), "ANSWER: 3 or 4"),
    (("3", "4"), "ANSWER: 3-4"),
    (("3", "4"), "ANSWER: between 3 and 4"),
    (("3", "4"), "ANSWER: 3 (or 4)"),
    (("3", "-3"), "ANSWER: x = 3 or x = -3"),
    (("391", "390"), "ANSWER: 391, or maybe 390"),
    (("Paris", "Rome"), "ANSWER: Paris or Rome"),
    (("Paris", "Rome"), "ANSWER: Paris/Rome"),
    (("Paris", "Rome"), "ANSWER: both Paris and Rome"),
    (("Buenos Aires", "Santiago"), "ANSWER: either Buenos Aires or Santiago"),
    (("d", "o"), "ANSWER: 'd' or 'o'"),
]

CHOICE_HEDGES: list[tuple[tuple[str, ...], str]] = [
    (("A", "B"), "Answer: A or B"),
    (("A", "B"), "Answer: B or A"),
    (("A", "C"), "ANSWER: either A or C"),
    (("A", "B"), "Answer: A/B"),
    (("A", "B"), "Answer: A, B"),
    (("A", "C"), "Answer: (A) and (C)"),
    (("A", "C"), "Answer: both A and C"),
    (("A", "B", "C", "D"), "Answer: A B C D"),
    (("A", "B", "C", "D"), "Answer: ABCD"),
    (("A", "B", "C", "D"), "Answer: A, B, C, or D"),
    (("B", "D"), "not sure: B or D"),
    (("A", "C"), "\\boxed{A} or \\boxed{C}"),
    (("B", "D"), "So \\boxed{B}.\n\nHmm, maybe \\boxed{D}."),
    (("A", "B"), "The answer is A or B."),
    (("A", "B"), "<answer>A or B</answer>"),
    (("A", "B"), "Answer: A. Or B."),
    (("A", "B"), "**Answer: A or B**"),
    (("A", "B"), "Answer: \\text{A} or \\text{B}"),
    (("A", "B"), "Answer: A | B"),
    (("B", "C"), "Answer: B (or C)"),
    (("A", "B"), "Options A or B both work."),
    # Only where the reader found its letter: no label starts a line, the last line is
    # something else.
    (("A", "B"), "Having checked, my answer: A or B\n\nThat is all."),
    (("A", "B"), "A or B"),
]

MATH_HEDGES: list[tuple[tuple[str, ...], str]] = [
    (("3", "4"), "ANSWER: 3 or 4"),
    (("3", "4"), "The final answer is 3 or 4"),
    (("3", "4"), "ANSWER: either 3 or 4"),
    (("3", "4"), "not sure: 3 or 4"),
    (("3", "4"), "ANSWER: 3 (or 4)"),
    (("3", "4"), "ANSWER: 3. Or 4."),
    (("3", "4"), "ANSWER: 3; 4"),
    (("3", "4"), "<answer>3 or 4</answer>"),
    (("3", "4"), "\\boxed{3} or \\boxed{4}"),
    (("3", "4"), "$\\boxed{3}$ and maybe $\\boxed{4}$"),
    (("3", "4"), "First \\boxed{3}, but checking again \\boxed{4}."),
    (("3", "4"), "\\boxed{3 \\text{ or } 4}"),
    (("3", "4"), "\\boxed{3, 4}"),
    (("3", "4"), "The answer is 3 or possibly 4."),
    (("3", "-3"), "ANSWER: x = 3 or x = -3"),
    (("\\frac{1}{2}", "\\frac{1}{3}"), "ANSWER: $\\frac{1}{2}$ or $\\frac{1}{3}$"),
]


# Hedges math-verify itself already reads as one set of values ({3, 4}), which no
# single-valued gold equals, with either extraction: wrong before the rule too.
ALREADY_SETS = {
    "\\boxed{3 \\text{ or } 4}",
    "\\boxed{3, 4}",
    "ANSWER: $\\frac{1}{2}$ or $\\frac{1}{3}$",
}


def _credited(
    grader: str, extractions: tuple[str | None, ...], options: tuple[str, ...], reply: str
) -> set[tuple[str | None, str]]:
    """The (extraction, gold) pairs under which ``reply`` grades correct."""
    return {
        (extraction, gold)
        for extraction in extractions
        for gold in options
        if _grade(grader, extraction, gold, reply).status == "correct"
    }


def _ids(cases: list[tuple[tuple[str, ...], str]]) -> list[str]:
    return [reply[:40] for _options, reply in cases]


@pytest.mark.parametrize(("options", "reply"), SHORT_HEDGES, ids=_ids(SHORT_HEDGES))
def test_short_answer_hedges_are_wrong(options: tuple[str, ...], reply: str) -> None:
    for gold in options:
        verdict = _grade("short", None, gold, reply)
        assert verdict.status == "incorrect", (gold, verdict.reason)


@pytest.mark.parametrize(("options", "reply"), CHOICE_HEDGES, ids=_ids(CHOICE_HEDGES))
def test_choice_hedges_are_wrong(options: tuple[str, ...], reply: str) -> None:
    for extraction in EXTRACTIONS:
        for gold in options:
            verdict = _grade("choice", extraction, gold, reply)
            assert verdict.status != "correct", (extraction, gold, verdict.reason)


@pytest.mark.process  # the math grader compares in child processes
@pytest.mark.parametrize(("options", "reply"), MATH_HEDGES, ids=_ids(MATH_HEDGES))
def test_math_hedges_are_wrong(options: tuple[str, ...], reply: str) -> None:
    for extraction in EXTRACTIONS:
        for gold in options:
            verdict = _grade("math", extraction, gold, reply)
            assert verdict.status != "correct", (extraction, gold, verdict.reason)


@pytest.mark.process
def test_positive_control_hedges_were_credited_without_the_wall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the hedge check removed, the hedges above are graded right (each short one,
    and most choice and math ones), so the tests above can fail."""
    with _wall_removed(monkeypatch):
        short = [
            reply
            for options, reply in SHORT_HEDGES
            if not _credited("short", (None,), options, reply)
        ]
        choice = [
            reply
            for options, reply in CHOICE_HEDGES
            if not _credited("choice", EXTRACTIONS, options, reply)
        ]
        maths = [
            reply
            for options, reply in MATH_HEDGES
            if not _credited("math", EXTRACTIONS, options, reply)
        ]
        # Credited for two different golds at once: the first/last rule of short answers.
        double = _credited("short", (None,), ("yes", "no"), "ANSWER: yes or no")
    assert short == []
    assert choice == []
    assert set(maths) == ALREADY_SETS, maths
    assert double == {(None, "yes"), (None, "no")}


def test_the_wall_is_what_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """One hedge per grader that only the hedge check turns from right to wrong."""
    cases = [
        ("short", None, "yes", "ANSWER: yes or no"),
        ("choice", "official", "A", "Answer: A or B"),
    ]
    for grader, extraction, gold, reply in cases:
        refused = _grade(grader, extraction, gold, reply)
        assert refused.status == "incorrect" and refused.detail.get("hedge") is True
        assert "hedge" in refused.reason and "several" in refused.reason
        with _wall_removed(monkeypatch):
            assert _grade(grader, extraction, gold, reply).status == "correct"


@pytest.mark.process
def test_math_wall_is_what_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    # math-verify reads 3 from an answer label without LaTeX; extraction: conductor read
    # the last of two boxes.
    for extraction, gold, reply in (
        ("official", "3", "ANSWER: 3 or 4"),
        ("conductor", "4", "First \\boxed{3}, but checking again \\boxed{4}."),
    ):
        refused = _grade("math", extraction, gold, reply)
        assert refused.status == "incorrect" and refused.detail.get("hedge") is True
        assert "'3', '4'" in refused.reason
        with _wall_removed(monkeypatch):
            assert _grade("math", extraction, gold, reply).status == "correct"


# --- near misses: one option with words around it ----------------------------------

# (gold, reply): right, with and without the wall.
SHORT_NEAR: list[tuple[str, str]] = [
    ("yes", "ANSWER: yes, or at least most likely"),
    ("yes", "ANSWER: Yes, 7 is prime."),
    ("yes", "ANSWER: Yes, definitely."),
    ("yes", "ANSWER: yes, not no"),
    ("no", "ANSWER: No, it is not Paris"),
    ("no", "ANSWER: No, that is not true."),
    ("no", "ANSWER: no, never"),
    ("3", "ANSWER: 3, or equivalently 3.0"),
    ("3", "ANSWER: 3 or 4 apples: 3"),
    ("391", "ANSWER: 17 * 23 = 391"),
    ("12", "ANSWER: 84 / 7 = 12"),
    ("144", "ANSWER: 144 (12 squared)"),
    ("4", "ANSWER: 3 + 1 = 4"),
    ("391", "ANSWER: 391, not 390"),
    ("Paris", "ANSWER: Paris, France"),
    ("Tokyo", "ANSWER: The capital of Japan is Tokyo."),
    ("Tokyo", "Tokyo is in Japan"),
    ("d", "ANSWER: I think it's 'd'"),
    ("d", "ANSWER: The first character is d."),
    ("closed | shut", "ANSWER: closed or shut"),
    ("Buenos Aires", "ANSWER: Buenos Aires"),
    ("yes", "ANSWER: \\boxed{yes}"),
]

CHOICE_NEAR: list[tuple[str, str]] = [
    ("B", "The answer is B (not A)"),
    ("B", "Answer: B (not A, not C)"),
    ("B", "Answer: B, rather than A"),
    ("C", "Answer: (C) 42 J"),
    ("D", "Answer: D. I ruled out A and B."),
    ("B", "Answer: B because A is too small"),
    ("B", "ANSWER: B\n\nA and C ignore friction, so they cannot be right."),
    ("C", "\\boxed{C}"),
    ("A", "Answer: D\n\nWait, re-checking the sign: the answer is A"),
]

MATH_NEAR: list[tuple[str, str]] = [
    ("3", "ANSWER: 3, or equivalently 3.0"),
    ("3", "ANSWER: 3 or 4 apples: 3"),
    ("3", "ANSWER: 3 (not 4)"),
    ("\\frac{1}{2}", "ANSWER: $\\frac{1}{2}$, or equivalently $0.5$"),
    (
        "\\frac{\\sqrt{2}}{2}",
        "ANSWER: $\\frac{\\sqrt{2}}{2}$ or equivalently $\\frac{1}{\\sqrt{2}}$",
    ),
    ("3, -3", "ANSWER: x = 3 or x = -3"),
    ("3, -3", "\\boxed{3} or \\boxed{-3}"),
    ("-3, 3", "The roots are \\boxed{x = 3 \\text{ or } x = -3}."),
    ("\\pm 3", "\\boxed{\\pm 3}"),
    ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}"),
    ("2, 3", "The solutions are \\boxed{2} and \\boxed{3}."),
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}"),
    ("[1,3)", "The solution set is $\\boxed{[1, 3)}$."),
    ("(1,2)", "\\boxed{(1, 2)}"),
    ("1000000", "\\boxed{1,000,000}"),
    (
        "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
        "$\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}}$",
    ),
    ("5", "The cases give \\boxed{4} ways, so the final answer is 5."),
    ("12", "ANSWER: 12. That is 3 rows of 4."),
    ("4", "First I wrote $\\boxed{4.0}$; as an integer that is $\\boxed{4}$."),
    ("\\frac{3}{4}", "Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct."),
]


def _same_with_and_without_wall(
    monkeypatch: pytest.MonkeyPatch, grader: str, extraction: str | None, gold: str, reply: str
) -> str:
    with_wall = _grade(grader, extraction, gold, reply)
    with _wall_removed(monkeypatch):
        without = _grade(grader, extraction, gold, reply)
    assert (with_wall.status, with_wall.extracted) == (without.status, without.extracted), (
        extraction,
        with_wall.reason,
    )
    return with_wall.status


@pytest.mark.parametrize(("gold", "reply"), SHORT_NEAR, ids=[r[:40] for _g, r in SHORT_NEAR])
def test_short_answer_near_misses_stay_right(
    monkeypatch: pytest.MonkeyPatch, gold: str, reply: str
) -> None:
    assert _same_with_and_without_wall(monkeypatch, "short", None, gold, reply) == "correct"


@pytest.mark.parametrize(("gold", "reply"), CHOICE_NEAR, ids=[r[:40] for _g, r in CHOICE_NEAR])
def test_choice_near_misses_stay_as_they_were(
    monkeypatch: pytest.MonkeyPatch, gold: str, reply: str
) -> None:
    statuses = {
        _same_with_and_without_wall(monkeypatch, "choice", extraction, gold, reply)
        for extraction in EXTRACTIONS
    }
    assert "correct" in statuses


@pytest.mark.process
@pytest.mark.parametrize(("gold", "reply"), MATH_NEAR, ids=[r[:40] for _g, r in MATH_NEAR])
def test_math_near_misses_and_set_golds_stay_as_they_were(
    monkeypatch: pytest.MonkeyPatch, gold: str, reply: str
) -> None:
    statuses = {
        _same_with_and_without_wall(monkeypatch, "math", extraction, gold, reply)
        for extraction in EXTRACTIONS
    }
    assert "correct" in statuses


def test_a_denied_or_computed_word_is_not_credited() -> None:
    """The first/last rule of short answers read a word the answer denies or computes
    with as the answer; the gold must be the option the answer names."""
    for gold, reply in (
        ("no", "ANSWER: yes, not no"),
        ("3", "ANSWER: 3 + 1 = 4"),
        ("17", "ANSWER: 17 * 23 = 391"),
        ("no", "ANSWER: neither yes nor no"),
        ("3", "ANSWER: 3-4"),
    ):
        assert _grade("short", None, gold, reply).status == "incorrect", reply


# --- the rule itself -------------------------------------------------------------------


def _letters(text: str, **kwargs: Any) -> list[str]:
    return [str(k) for k in named_options(text, lambda part: letter_options(part, 4), **kwargs)]


def test_named_options_splits_alternatives_and_drops_denials() -> None:
    assert _letters("either A or C") == ["A", "C"]
    assert _letters("(A) and (C)") == ["A", "C"]
    assert _letters("A/B") == ["A", "B"]
    assert _letters("neither A nor B") == []
    assert _letters("B (not A)") == ["B"]
    assert _letters("B, rather than A") == ["B"]
    assert _letters("A or B? B") == ["B"]  # a restatement settles
    assert _letters("A: B") == ["A", "B"]  # ... only on an option named before it
    assert _letters("not sure: B or D") == ["B", "D"]
    assert _letters("D. I ruled out A and B.", first_sentence=True) == ["D"]
    assert _letters("D. I ruled out A and B.") == ["D", "B"]
    assert _letters("A. Or B.", first_sentence=True) == ["A", "B"]
    assert _letters("\\boxed{A \\text{ or } B}") == ["A", "B"]
    assert _letters("E or A") == ["A"]  # E is no option of four


def test_math_options_are_values_not_prose() -> None:
    def values(text: str) -> list[str]:
        return list(named_options(text, math_options).values())

    assert values("x = 3 or x = -3") == ["x = 3", "x = -3"]
    assert values("(1, 2) or [1, 3)") == ["(1, 2)", "[1, 3)"]
    assert values("1,000,000") == ["1,000,000"]
    assert values("3, or equivalently 3.0") == ["3"]  # one value, written twice
    assert values("3 rows and 4 columns") == []
    assert values("\\frac{a}{b}") == ["\\frac{a}{b}"]
    assert values("a/b") == ["a/b"]  # a quotient, not two answers


def test_answer_places() -> None:
    assert answer_places("Try \\boxed{4} first. <answer>5 or 6</answer>") == [["5 or 6"]]
    assert answer_places("\\boxed{3} then \\boxed{\\boxed{4}}\nANSWER: 4") == [
        ["3", "\\boxed{4}"],
        ["4"],
    ]
    assert answer_places("So the answer is 3 or 4.\nThanks") == [["3 or 4."]]
    assert answer_places("It is\n\nmaybe 3 or 4") == [["maybe 3 or 4"]]
    assert answer_places("<think>\\boxed{1} or \\boxed{2}</think>") == []
    assert hedge_in([["3"], ["3 or 4"]], math_options) == {
        next(iter(math_options(Part("3", False)))): "3",
        next(iter(math_options(Part("4", False)))): "4",
    }


@pytest.mark.long  # works through megabyte replies
def test_the_hedge_rule_is_bounded_on_hostile_replies() -> None:
    size = MAX_RESPONSE_CHARS
    hostile = [
        "ANSWER: " + "yes or " * (size // 7),
        "ANSWER: " + "(" * size,
        "ANSWER: " + "(or " * (size // 8) + ")" * (size // 8),
        "\\boxed{" * (size // 7) + "A" + "}" * (size // 7),
        "ANSWER: " + "A," * (size // 2),
        "ANSWER: " + "A: " * (size // 3),
        "ANSWER: yes" + " (or maybe)" * (size // 11),
        "ANSWER: " + "\\begin{x}" * (size // 9),
    ]
    for reply in hostile:
        for grader, extraction, gold in (
            ("short", None, "yes"),
            ("choice", "official", "A"),
            ("choice", "conductor", "A"),
        ):
            started = time.monotonic()
            _grade(grader, extraction, gold, reply * 4)  # cut to its tail first
            # Only a hang fails this; the work is linear in the reply.
            assert time.monotonic() - started < 60, (grader, reply[:40])


# --- gold answers given verbatim -----------------------------------------------------


def _short_golds() -> list[str]:
    golds: list[str] = []
    for name in ("smoke.jsonl", "smoke-route.jsonl"):
        for line in (ROOT / "benchmarks" / name).read_text(encoding="utf-8").splitlines():
            answer = str(json.loads(line)["answer"])
            golds.append(answer)
    return golds


VERBATIM_FORMS = ("{}", "ANSWER: {}", "\\boxed{{{}}}", "<answer>{}</answer>", "The answer is {}.")


def test_shipped_short_answer_golds_given_verbatim_are_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    golds = _short_golds()
    assert len(golds) == 310
    changed: list[tuple[str, str]] = []
    for gold in golds:
        for written in {gold, *(g.strip() for g in gold.split("|"))}:
            for form in VERBATIM_FORMS:
                reply = form.format(written)
                with_wall = _grade("short", None, gold, reply).status
                with _wall_removed(monkeypatch):
                    without = _grade("short", None, gold, reply).status
                if with_wall != without:
                    changed.append((gold, reply))
    assert changed == []


# Gold answers of the shapes MATH-500 and AIME use (and the math fixtures' own).
MATH_GOLDS = [
    "1000", "\\frac{3}{4}", "5", "-3", "0.5", "2\\sqrt{2}", "\\frac{\\sqrt{3}}{2}", "10\\%",
    "30^\\circ", "\\$18.90", "\\$32{,}348", "1011_2", "x^2+2x+1", "(1,2)", "\\{1,2\\}",
    "2, 3", "-1, 3", "[1,3)", "(-\\infty, 3]", "\\pm 3", "3 \\text{ or } -3", "\\text{(C)}",
    "\\text{Evelyn}", "\\text{east}", "p - q", "6 - 5i", "\\left( 3, \\frac{\\pi}{2} \\right)",
    "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\infty", "\\pi", "1,000,000", "2\\pi",
    "\\frac{1}{2}, \\frac{1}{3}", "x \\in [-2,7]", "a^2 + b^2", "\\sqrt{6}", "11\\sqrt2", "4374",
]  # fmt: skip


@pytest.mark.process
def test_math_golds_given_verbatim_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    golds = list(MATH_GOLDS)
    for name in ("math500.jsonl", "aime24.jsonl", "aime25.jsonl"):
        for line in (ROOT / "tests" / "fixtures" / "bench" / name).read_text().splitlines():
            row = json.loads(line)
            golds.append(str(row.get("answer", row.get("Answer"))))
    for case in json.loads((ROOT / "tests" / "cases" / "grade_math.json").read_text()):
        if isinstance(case["gold"], str):
            golds.append(case["gold"])
    changed: list[tuple[str, str, str]] = []
    for gold in golds:
        for extraction in EXTRACTIONS:
            for form in ("\\boxed{{{}}}", "ANSWER: ${}$"):
                reply = form.format(gold)
                with_wall = _grade("math", extraction, gold, reply).status
                with _wall_removed(monkeypatch):
                    without = _grade("math", extraction, gold, reply).status
                if with_wall != without:
                    changed.append((extraction, gold, reply))
    assert changed == []
