"""The math and choice graders against the reference harness, on a corpus of replies.

The corpus (``tests/cases/answer_agreement.json``) holds correct, wrong and tricky
replies, each with the verdict a careful reader gives (``truth``) and, where the
project's reading or the reference's is wrong, a note saying which and why.  The
comparisons live in ``benchmarks/graders/answer_agreement.py``, which prints the same
numbers.

lighteval is not installed here (see the skip reason below).  Its own extractor
(lighteval 0.13.0, loaded once by hand without its package's heavy imports) read all
29 recorded letters as the corpus has them, and its MATH-500 metric agreed with the
math grader on 45 of the 46 math cases (the odd one out is ``two_boxes_last_right``,
where lighteval's copy of the extraction differs from math-verify 0.9.0; see its note).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conductor.grading import get_grader
from conductor.grading.extract import official_letter
from conductor.grading.types import Sample

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "graders" / "answer_agreement.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("answer_agreement", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


agreement = _load_script()
CASES: list[dict[str, Any]] = agreement.load_cases()
MATH = [case for case in CASES if case["grader"] == "math"]
CHOICE = [case for case in CASES if case["grader"] == "choice"]


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


def test_the_corpus_holds_every_measured_problem() -> None:
    names = _ids(CASES)
    assert len(names) == len(set(names))
    assert len(MATH) >= 40 and len(CHOICE) >= 25
    for needed in ("dollar_gold", "two_boxes", "final_answer_is_no_colon", "answer_tag"):
        assert any(needed in name for name in _ids(MATH)), needed
    # Letters inside sentences and option lists, not only on an answer line.
    assert {"letter_in_sentence", "options_listed_then_so", "option_is_correct"} <= set(
        _ids(CHOICE)
    )
    assert {agreement.truth(case) for case in MATH} == {True, False}
    assert {agreement.truth(case) for case in CHOICE} == {True, False}


@pytest.mark.parametrize("case", MATH, ids=_ids(MATH))
def test_official_math_verdicts_are_math_verify_verdicts(case: dict[str, Any]) -> None:
    reference = agreement.reference_math(case)
    assert agreement.project(case, "official") == reference
    # A reference verdict that is wrong is a documented one.
    if reference != agreement.truth(case):
        assert "reference wrong" in case.get("note", ""), case["name"]


@pytest.mark.parametrize("case", CHOICE, ids=_ids(CHOICE))
def test_official_letters_follow_lighteval_rules(case: dict[str, Any]) -> None:
    assert official_letter(case["response"], case["n_choices"]) == case["official"]
    reference = agreement.reference_choice(case, live=False)
    assert agreement.project(case, "official") == reference
    if reference != agreement.truth(case):
        assert "reference wrong" in case.get("note", ""), case["name"]


@pytest.mark.skipif(
    not agreement.lighteval_available(),
    reason="lighteval is not installed (it pins latex2sympy2_extended 1.0.6 against "
    "math-verify's 1.11 and pulls torch, transformers and inspect-ai): the letters it "
    "reads are the corpus's recorded 'official' ones, worked out from its rules",
)
@pytest.mark.parametrize("case", CHOICE, ids=_ids(CHOICE))
def test_lighteval_reads_the_recorded_letters(case: dict[str, Any]) -> None:
    assert agreement.lighteval_letter(case) == case["official"]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_conductor_extraction_disagrees_only_where_documented(case: dict[str, Any]) -> None:
    mine = agreement.project(case, "conductor")
    if case["grader"] == "math":
        reference = agreement.reference_math(case)
    else:
        reference = agreement.reference_choice(case, live=False)
    if mine != reference:
        side = "reference wrong" if mine == agreement.truth(case) else "conductor wrong"
        assert side in case.get("note", ""), (case["name"], side)


def test_dollar_valued_golds_are_graded_by_value() -> None:
    # MATH-500 writes three golds as amounts (\$18.90); they were once a grader_error
    # for every reply not identical to them.
    for extraction in ("official", "conductor"):
        grader = get_grader("math", {"extraction": extraction})
        sample = Sample(id="s", input={}, gold=r"\$18.90")
        assert grader.grade(r"\boxed{18.9}", sample).status == "correct"
        assert grader.grade(r"\boxed{\$18.90}", sample).status == "correct"
        assert grader.grade(r"\boxed{19.80}", sample).status == "incorrect"


def test_extraction_is_an_option_that_must_name_a_reading() -> None:
    assert get_grader("math", {"warm": False}).extraction == "official"  # type: ignore[attr-defined]
    assert get_grader("choice").extraction == "official"  # type: ignore[attr-defined]
    for name in ("math", "choice"):
        with pytest.raises(Exception, match="extraction must be one of official, conductor"):
            get_grader(name, {"extraction": "lenient"})


def test_the_script_prints_a_row_per_grader_and_extraction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert agreement.main([]) == 0
    out = capsys.readouterr().out
    for grader in ("math", "choice"):
        for extraction in ("official", "conductor"):
            assert any(line.split()[:2] == [grader, extraction] for line in out.splitlines()), (
                grader,
                extraction,
            )
