"""The math grader: is the reply's final answer mathematically equal to the gold?

By default (``extraction: official``) a reply is graded as the reference harness grades
MATH-500: math-verify reads the whole reply (its own rules find the answer: a "final
answer is" phrase, ``\\boxed{}``, an ``answer:`` label, else the last expression) and
decides equivalence (``1/2`` = ``0.5`` = ``\\frac{1}{2}``, ``2\\sqrt{2}`` = ``\\sqrt{8}``,
``{1,2}`` = ``{2,1}``, ``x=3`` = ``3``, ``30^\\circ`` = ``30``, ``\\$18.90`` = ``18.9``),
with the extraction targets and rounding of lighteval's MATH-500 metric.  Note that
math-verify treats a percentage loosely: ``10\\%`` matches both ``0.1`` and ``10``.

``extraction: conductor`` is this project's own reading, kept as a named option: an
``<answer>`` tag (which math-verify does not read), the last ``\\boxed{}``, an
``ANSWER:`` line, and nothing else (prose without one of those is ``no_answer``, where
math-verify would take the reply's last number); plainly numeric answers are then
settled in this process without a child (below).  Runs record
the option in their config, so a score says which reading it used.

math-verify's own time limits use ``signal.alarm``, which works only on a process's main
thread, and graders run in worker threads.  So every comparison runs in a small pool of
child processes (fresh interpreters started with :mod:`subprocess`, speaking JSON lines
over their standard streams: nothing is inherited and the caller's main script is not
re-run, unlike multiprocessing's spawn) with math-verify's time limits off.  The parent
waits at most ``timeout_s`` for the answer and otherwise kills that child (a new one is
started for the next comparison) and returns a ``time_limit`` verdict.

The children are started in the background when a grader is built, so the first
answer that needs one does not wait for sympy to load.  With ``extraction: conductor``
most answers never need one: answers equal as normalised strings are accepted, and
plainly numeric answers (integers, decimals, fractions ``a/b`` or ``\\frac{a}{b}``) are
compared exactly in this process: equal values are correct, and clearly different
values (all integers, or more than 0.1% apart) are incorrect.  Only numbers close but
not equal go to math-verify, whose rounding decides them.

The child processes (both sides of the pipe) are :mod:`conductor.grading.math_children`.
"""

from __future__ import annotations

import atexit
import importlib.util
import re
import time
from fractions import Fraction
from typing import Any

from conductor.errors import MissingDependencyError
from conductor.grading.extract import (
    EXTRACTIONS,
    MAX_RESPONSE_CHARS,
    check_extraction,
    clip_tail,
    extract_math_answer,
    strip_think,
)
from conductor.grading.math_children import ChildFailed, ChildPool
from conductor.grading.types import Sample, Verdict

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EXTRACTIONS",
    "MathGrader",
    "normalise_answer",
    "plain_number",
]

#: How long one comparison may take before the child is killed.
DEFAULT_TIMEOUT_S = 5.0
# Child processes kept warm; each comparison takes one for itself.
_MAX_WORKERS = 2
# LaTeX spacing and sizing that never changes a value.
_SPACING = re.compile(r"\\[,!;: ]|\\(?:left|right|displaystyle)(?![A-Za-z])|\s+")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# A plain number after normalising: an integer or decimal, ``a/b``, or ``\frac{a}{b}``
# (``\frac12`` too), with an optional sign.  Anything else (commas, units, percent
# signs, exponents) is left to math-verify.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_FRACTION = re.compile(
    r"([+-]?)(?:(\d+)/(\d+)|\\frac(?:\{(\d+)\}\{(\d+)\}|(\d)(\d)|\{(\d+)\}(\d)|(\d)\{(\d+)\}))"
)
# Values this close (relative) are left to math-verify, which rounds before comparing.
_CLOSE = Fraction(1, 1000)


def normalise_answer(answer: str) -> str:
    """A canonical spelling for the exact-match fast path.

    Removes math delimiters, whitespace and LaTeX spacing / sizing commands, spells
    ``\\dfrac`` and ``\\tfrac`` as ``\\frac`` and drops a trailing full stop.  Two
    answers with equal normal forms are equal; unequal ones may still be equivalent.
    """
    value = answer.strip()
    for opening, closing in _DELIMITERS:
        if len(value) > len(opening) + len(closing) and (
            value.startswith(opening) and value.endswith(closing)
        ):
            value = value[len(opening) : -len(closing)].strip()
            break
    value = _SPACING.sub("", value)
    value = _FRAC_VARIANTS.sub(r"\\frac", value)
    return value.rstrip(".")


def plain_number(answer: str) -> tuple[Fraction, bool] | None:
    """``(value, is_integer_literal)`` of an answer written as a plain number, else None.

    ``1/2``, ``0.5``, ``\\frac{1}{2}`` and ``$-3$`` are plain numbers; ``1,000``,
    ``10\\%``, ``1e3`` and ``x=3`` are not (math-verify reads those).
    """
    value = normalise_answer(answer)
    for opening, closing in _DELIMITERS:  # "$42$." loses its full stop first
        if len(value) > len(opening) + len(closing) and (
            value.startswith(opening) and value.endswith(closing)
        ):
            value = value[len(opening) : -len(closing)]
            break
    if len(value) > 100:
        return None
    if _NUMBER.fullmatch(value):
        return Fraction(value), "." not in value
    match = _FRACTION.fullmatch(value)
    if match is None:
        return None
    sign, *parts = match.groups()
    numerator, denominator = (p for p in parts if p is not None)
    if int(denominator) == 0:
        return None
    fraction = Fraction(int(numerator), int(denominator))
    return (-fraction if sign == "-" else fraction), False


def _numeric_verdict(golds: list[str], predicted: str) -> tuple[bool, str] | None:
    """``(equal, gold)`` when plain numbers settle the comparison without math-verify;
    ``None`` when the answer or a gold is not a plain number, or the values are close."""
    answer = plain_number(predicted)
    if answer is None:
        return None
    values = [plain_number(gold) for gold in golds]
    for gold, value in zip(golds, values, strict=True):
        if value is not None and value[0] == answer[0]:
            return True, gold
    for value in values:
        if value is None:
            return None
        both_integers = value[1] and answer[1]
        scale = max(abs(value[0]), abs(answer[0]))
        if not both_integers and abs(value[0] - answer[0]) <= _CLOSE * scale:
            return None
    return False, golds[0]


_POOL = ChildPool(_MAX_WORKERS)
atexit.register(_POOL.close)


class MathGrader:
    """Grades math answers by equivalence (math-verify), with a hard time limit.

    ``extraction`` chooses how the answer is read (:data:`EXTRACTIONS`; see the module
    docstring).  The gold is a string (a number or LaTeX, without ``$``; an escaped
    ``\\$`` of an amount is fine), or a list of acceptable answers.  Building one
    starts the comparison processes in the background (``warm=False`` does not).
    """

    name = "math"
    # 3: official extraction by default; dollar-valued golds are read as numbers.
    version = "3"

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_chars: int = MAX_RESPONSE_CHARS,
        warm: bool = True,
        extraction: str = "official",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        if max_chars <= 0:
            raise ValueError("max_chars must be positive")
        if importlib.util.find_spec("math_verify") is None:
            raise MissingDependencyError(
                "the math grader needs math-verify: pip install 'math-verify[antlr4_13_2]'"
            )
        self.timeout_s = float(timeout_s)
        self.max_chars = max_chars
        self.extraction = check_extraction(extraction)
        if warm:
            self.warm()

    def warm(self) -> None:
        """Start the comparison processes in the background (no wait)."""
        _POOL.warm()

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        """Find the final answer in ``response`` and compare it with the gold."""
        golds = _gold_answers(sample.gold)
        if not golds:
            return Verdict(
                "grader_error", f"the sample has no usable gold answer ({sample.gold!r})"
            )
        detail: dict[str, Any] = {"gold": golds[0] if len(golds) == 1 else golds}
        if response and len(response) > self.max_chars:
            detail["truncated"] = True
        # Reasoning blocks are not the answer (lighteval grades the text after them too).
        body = strip_think(clip_tail(response, self.max_chars)) if response else ""
        if self.extraction == "official":
            return self._grade_reply(golds, body, detail)
        extracted = extract_math_answer(body) if body else None
        if extracted is None:
            return Verdict(
                "no_answer",
                "no answer could be read (no <answer> tag, \\boxed{} or ANSWER: line)",
                detail=detail,
            )
        return self._grade_extracted(golds, extracted, detail)

    def _grade_reply(self, golds: list[str], body: str, detail: dict[str, Any]) -> Verdict:
        """The reference harness's reading: math-verify finds the answer in the reply."""
        detail["method"] = "math_verify_reply"
        reply = self._ask({"golds": golds, "reply": body}, detail) if body.strip() else {}
        if isinstance(reply, Verdict):
            return reply
        extracted = reply.get("extracted")
        if not extracted:
            return Verdict(
                "no_answer",
                "no answer could be read (math-verify found no final answer, \\boxed{}, "
                "answer label or expression)",
                detail=detail,
            )
        return self._verdict(golds, str(extracted), reply, detail)

    def _grade_extracted(self, golds: list[str], extracted: str, detail: dict[str, Any]) -> Verdict:
        """This project's reading (``extraction: conductor``): compare the answer found."""
        normal = normalise_answer(extracted)
        for gold in golds:
            if normal and normal == normalise_answer(gold):
                detail["method"] = "exact"
                return Verdict(
                    "correct", f"{extracted!r} equals the gold answer", extracted, detail
                )

        settled = _numeric_verdict(golds, extracted)
        if settled is not None:
            detail["method"] = "numeric"
            equal, gold = settled
            if equal:
                return Verdict("correct", f"{extracted!r} equals {gold!r}", extracted, detail)
            return self._verdict(golds, extracted, {"equal": False, "parsed": True}, detail)

        detail["method"] = "math_verify"
        reply = self._ask({"golds": golds, "predicted": extracted}, detail, extracted)
        if isinstance(reply, Verdict):
            return reply
        return self._verdict(golds, extracted, reply, detail)

    def _ask(
        self, request: dict[str, Any], detail: dict[str, Any], extracted: str | None = None
    ) -> dict[str, Any] | Verdict:
        """A child's reply to ``request``, or the verdict that it failed or timed out."""
        started = time.monotonic()
        try:
            reply = _POOL.ask(request, self.timeout_s)
        except ChildFailed as exc:
            return Verdict("grader_error", str(exc), extracted, detail)
        detail["elapsed_s"] = round(time.monotonic() - started, 3)
        if reply is None:
            what = repr(extracted[:80]) if extracted is not None else "the reply"
            return Verdict(
                "time_limit",
                f"comparing {what} with the gold took over {self.timeout_s:g} s",
                extracted,
                detail,
            )
        if "error" in reply:
            return Verdict("grader_error", str(reply["error"]), extracted, detail)
        return reply

    @staticmethod
    def _verdict(
        golds: list[str], extracted: str, reply: dict[str, Any], detail: dict[str, Any]
    ) -> Verdict:
        """``correct`` or ``incorrect`` from a comparison's outcome."""
        if reply.get("equal"):
            return Verdict(
                "correct", f"{extracted!r} is equivalent to {reply['gold']!r}", extracted, detail
            )
        shown = golds[0] if len(golds) == 1 else golds
        why = (
            "is not equivalent to"
            if reply.get("parsed", True)
            else "could not be read as math, nor equals"
        )
        return Verdict(
            "incorrect", f"{extracted!r} {why} the gold answer {shown!r}", extracted, detail
        )


def _gold_answers(gold: object) -> list[str]:
    """The gold as a list of non-empty strings (a list gold means several are accepted)."""
    items = gold if isinstance(gold, (list, tuple)) else [gold]
    answers: list[str] = []
    for item in items:
        if item is None or isinstance(item, bool):
            continue
        text = str(item).strip()
        if text:
            answers.append(text)
    return answers
