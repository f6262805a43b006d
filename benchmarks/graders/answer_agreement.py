"""How often the project's answer graders agree with the reference harness's.

Reads the corpus ``tests/cases/answer_agreement.json`` (math and multiple-choice
replies, each with the verdict a careful reader gives: ``truth``) and prints, per grader
and extraction (``official``, the default, and ``conductor``, the project's own
reading), how many cases there are, how many verdicts agree with the reference, and for
the disagreements who is right.

The references: for math, math-verify itself, called as lighteval's MATH-500 metric
calls it (expressions then LaTeX, floats rounded to 6 places, reasoning blocks
removed); for letters, lighteval's extractor when lighteval is installed, otherwise the
letter the corpus records as lighteval's reading (``official``, worked out from its
rules).  Run: ``python benchmarks/graders/answer_agreement.py`` (``--json`` for the
numbers as JSON).  ``tests/test_answer_agreement.py`` holds the same comparisons as
assertions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CASES_PATH = Path(__file__).resolve().parents[2] / "tests" / "cases" / "answer_agreement.json"
EXTRACTIONS = ("official", "conductor")


def load_cases(path: Path = CASES_PATH) -> list[dict[str, Any]]:
    """The corpus, as a list of case objects."""
    cases: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return cases


def _after_reasoning(text: str) -> str:
    # lighteval grades the text after a reasoning block (its remove_reasoning_tags).
    return text.rsplit("</think>", 1)[-1]


def reference_math(case: dict[str, Any]) -> bool:
    """math-verify's verdict on a math case, with lighteval's MATH-500 settings."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = [ExprExtractionConfig(), LatexExtractionConfig()]
    gold = parse(f"${case['gold']}$", targets, parsing_timeout=None) or [case["gold"]]
    pred = parse(_after_reasoning(case["response"]), targets, parsing_timeout=None)
    return bool(verify(gold, pred, float_rounding=6, timeout_seconds=None))


def lighteval_letter(case: dict[str, Any]) -> str | None:
    """The letter lighteval's own extractor reads; raises ImportError without lighteval."""
    from lighteval.metrics.utils.extractive_match_utils import (
        IndicesExtractionConfig,
        extract_target_from_pred,
        lazy_indices_regex,
    )
    from lighteval.utils.language import Language

    config = IndicesExtractionConfig(
        prefix_for_extraction="NativeLetters", try_extract_without_anchor=True
    )
    regexes = lazy_indices_regex(config, case["n_choices"], Language.ENGLISH)
    found = extract_target_from_pred(_after_reasoning(case["response"]), [(regexes, config)])
    return str(found[0]) if found else None


def lighteval_available() -> bool:
    """Whether lighteval's extractor can be imported here."""
    try:
        lighteval_letter({"n_choices": 4, "response": "Answer: A"})
    except ImportError:
        return False
    return True


def reference_choice(case: dict[str, Any], live: bool) -> bool:
    """Whether the reference counts a choice case correct (lighteval when ``live``)."""
    letter = lighteval_letter(case) if live else case["official"]
    return bool(letter == case["gold"])


def truth(case: dict[str, Any]) -> bool:
    """Whether the reply is right, as the corpus's careful reader says."""
    if case["grader"] == "math":
        return bool(case["truth"])
    return bool(case["truth"] == case["gold"])


def project(case: dict[str, Any], extraction: str) -> bool:
    """Whether the project's grader, with ``extraction``, counts the case correct."""
    from conductor.grading import get_grader
    from conductor.grading.types import Sample

    inputs: dict[str, Any] = {}
    if case["grader"] == "choice":
        inputs["choices"] = [f"option {i}" for i in range(case["n_choices"])]
    grader = get_grader(case["grader"], {"extraction": extraction})
    sample = Sample(id=case["name"], input=inputs, gold=case["gold"])
    verdict = grader.grade(case["response"], sample)
    return verdict.status == "correct"


@dataclass
class Tally:
    """Agreement of one grader and extraction with the reference."""

    grader: str
    extraction: str
    n: int = 0
    agree: int = 0
    project_right: int = 0
    reference_right: int = 0

    @property
    def disagree(self) -> int:
        return self.n - self.agree


def measure(cases: list[dict[str, Any]], live_lighteval: bool) -> list[Tally]:
    """One :class:`Tally` per grader and extraction."""
    references: dict[str, Callable[[dict[str, Any]], bool]] = {
        "math": reference_math,
        "choice": lambda case: reference_choice(case, live_lighteval),
    }
    tallies: list[Tally] = []
    for grader, reference in references.items():
        mine = [case for case in cases if case["grader"] == grader]
        expected = [reference(case) for case in mine]
        for extraction in EXTRACTIONS:
            tally = Tally(grader, extraction)
            for case, ref in zip(mine, expected, strict=True):
                got = project(case, extraction)
                tally.n += 1
                if got == ref:
                    tally.agree += 1
                elif got == truth(case):
                    tally.project_right += 1
                else:
                    tally.reference_right += 1
            tallies.append(tally)
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args(argv)
    # math-verify warns that its time limits are off: on purpose, as in the grader.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    live = lighteval_available()
    tallies = measure(load_cases(), live)
    if args.json:
        rows = [dict(vars(t), disagree=t.disagree) for t in tallies]
        print(json.dumps({"lighteval": live, "tallies": rows}, indent=1))
        return 0
    source = (
        "lighteval"
        if live
        else "lighteval's rules as the corpus records them (lighteval is not installed)"
    )
    print(f"references: math-verify (math); {source} (choice)")
    print(f"{'grader':8} {'extraction':10} {'n':>4} {'agree':>6} {'disagree':>8}  who is right")
    for t in tallies:
        who = f"project {t.project_right}, reference {t.reference_right}" if t.disagree else "-"
        print(f"{t.grader:8} {t.extraction:10} {t.n:>4} {t.agree:>6} {t.disagree:>8}  {who}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
