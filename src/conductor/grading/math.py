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

Hedges are wrong, with either extraction (the rule every grader shares,
:func:`~conductor.grading.extract.hedge_in`): an answer that names two or more values
not all equivalent to a gold that is one value is ``incorrect``, whatever a reader
would take from it.  How the reference treats several answers: math-verify 0.9.0 reads
several ``\\boxed{}`` as one *set* of answers (its greedy box pattern hands the
normaliser every box of the reply, which joins them all; its box pattern joins boxes
less than 10 characters apart, or joined by "and", "or", a comma or a semicolon within
70), and two to six LaTeX spans joined by "and", "or" or a comma likewise; lighteval's
MATH-500 extraction carries the same patterns.  So ``\\boxed{3} or \\boxed{4}``,
``\\boxed{3 \\text{ or } 4}`` and ``$3$ or $4$`` are the set {3, 4} there, right only
against that set, but an answer without LaTeX is read as its first or last number:
math-verify takes 3 from ``ANSWER: 3 or 4`` and from "the final answer is 3 or 4", and
4 from "not sure: 3 or 4" (measured).  The rule chosen here follows the sets and closes
the rest:

* the places examined are every ``\\boxed{}`` of the reply together (boxes that
  disagree are a hedge even when the later one reads as a correction, as in
  math-verify), the last ``ANSWER:`` label, the last "the answer is ..." phrase, an
  ``<answer>`` tag (then alone), or the last line of a reply with none of these;
* in each, values are separated by "or", "and", "either", "both", commas, semicolons,
  ``\\text{ or }``, ``\\lor`` and sentence ends, outside brackets (``(1, 2)`` and
  ``[1, 3)`` are one value); a part with words of prose in it ("3 rows of 4") is not a
  value, "x =" before a value is dropped, "not 4" names nothing;
* two values are one when they are equal numbers, the same after normalising, or
  (only when needed) equivalent by math-verify: "3, or equivalently 3.0",
  ``\\frac{1}{2} or 0.5``;
* a gold that is itself several values (a comma, ``\\pm``, ``\\cup``, a set
  ``\\{..\\}``, "3 or -3") or an interval is compared as today, set against set by
  math-verify: ``x = 3 or x = -3`` is right for the gold ``3, -3`` and wrong for 3.

So two boxes "first \\boxed{3}, then \\boxed{4}" are wrong with ``extraction:
conductor`` too, which reads the last box (they were right before, for 4).
"""

from __future__ import annotations

import atexit
import importlib.util
import re
import time
from collections.abc import Hashable
from fractions import Fraction
from typing import Any

from conductor.errors import MissingDependencyError
from conductor.grading.extract import (
    EXTRACTIONS,
    MAX_RESPONSE_CHARS,
    Part,
    answer_places,
    check_extraction,
    clip_tail,
    extract_math_answer,
    hedge_in,
    named_options,
    strip_think,
)
from conductor.grading.math_children import ChildFailed, ChildPool
from conductor.grading.types import Sample, Verdict

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EXTRACTIONS",
    "MathGrader",
    "math_options",
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


# What makes a part of an answer prose rather than a value: a word of two letters or
# more that is no LaTeX command (units in \text{} are taken out first).
_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_TEXT_GROUP = re.compile(r"\\(?:text|textrm|textbf|textit|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
# "x = " or "a_1 = " before a value.
_ASSIGNED = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=\s*")
# What makes a gold several values or a range: a comma (not a thousands separator),
# plus-minus, a union, a set.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))|\{,\}")
_SEVERAL = re.compile(r",|\\pm|\\mp|\\cup|\\\{")


def math_options(part: Part) -> list[Hashable]:
    """The value one part of an answer names, for the hedge rule (a
    :data:`~conductor.grading.extract.Recognise`): its exact value when it is a plain
    number, else its normalised spelling; nothing for prose ("3 rows of 4")."""
    value = part.text.strip().strip("$").strip()
    bare = _COMMAND.sub(" ", _TEXT_GROUP.sub(" ", value))
    if _PROSE.search(bare) or not re.search(r"[0-9A-Za-z]", bare):
        return []
    value = _ASSIGNED.sub("", value)
    number = plain_number(value)
    return [number[0]] if number is not None else [normalise_answer(value)]


def _several_values(gold: str) -> bool:
    """Whether a gold is several values or a range, compared as a whole (see the
    module docstring)."""
    if _SEVERAL.search(_THOUSANDS.sub("", gold)):
        return True
    return len(named_options(gold, math_options)) >= 2


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
    # 4: hedges ("3 or 4", boxes that disagree) are wrong.
    version = "4"

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
            verdict = self._grade_reply(golds, body, detail)
        else:
            extracted = extract_math_answer(body) if body else None
            if extracted is None:
                return Verdict(
                    "no_answer",
                    "no answer could be read (no <answer> tag, \\boxed{} or ANSWER: line)",
                    detail=detail,
                )
            verdict = self._grade_extracted(golds, extracted, detail)
        return self._refuse_hedge(golds, body, verdict)

    def _refuse_hedge(self, golds: list[str], body: str, verdict: Verdict) -> Verdict:
        """``verdict``, or ``incorrect`` when the reply names several values and the gold
        is one (see the module docstring)."""
        if verdict.status != "correct" or any(_several_values(gold) for gold in golds):
            return verdict
        several = hedge_in(answer_places(body), math_options)
        if several is None:
            return verdict
        # Spellings of one value ("\\sqrt{2}/2 or \\frac{1}{\\sqrt2}") are one option.
        if all(self._equals_gold(golds, text) for text in several.values()):
            return verdict
        verdict.detail["hedge"] = True
        named = ", ".join(repr(text) for text in several.values())
        return Verdict(
            "incorrect",
            f"the answer names several values ({named}): a hedge is not an answer",
            verdict.extracted,
            verdict.detail,
        )

    def _equals_gold(self, golds: list[str], value: str) -> bool:
        """Whether ``value`` is equivalent to a gold (a comparison that fails or runs out
        of time is not)."""
        if any(normalise_answer(value) == normalise_answer(gold) for gold in golds):
            return True
        settled = _numeric_verdict(golds, value)
        if settled is not None:
            return settled[0]
        reply = self._ask({"golds": golds, "predicted": value}, {}, value)
        return not isinstance(reply, Verdict) and bool(reply.get("equal"))

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
