"""The short-answer grader: a word, a name or a number, compared after normalising.

For questions whose answer is one short phrase ("Paris", "yes", "391", "cba"), where
math equivalence means nothing and a letter grader does not apply.  The reply's final
answer is found as the math grader finds it (an ``<answer>`` tag, a ``\\boxed{}``, an
``ANSWER:`` line; a reply that is one short line is its own answer) and is correct
when, after normalising, it *is* the gold:

* case, quotes, backticks, markup, punctuation and the articles "a", "an" and "the"
  are ignored ("The Paris." = "paris");
* plain numbers compare by value ("200.0" = "200");
* small models answer in a sentence, so a gold of N words also matches the first N or
  the last N words of the answer ("Yes, 7 is prime." and "The capital of Japan is
  Tokyo." are right; "Tokyo is in Japan" is right for "Tokyo" too).

Nothing looser: a gold in the middle of the answer ("I think Paris or Rome") is not
found, and a wrong number at the end ("17 * 23 = 349") is wrong.  The first/last rule
can accept a negated sentence ("No, it is not Paris" for the gold "no" is right, but
so is "It is not Paris" for "paris"): keep gold answers and prompts such that the
model is asked for the bare answer.  Several accepted answers are written
``gold1 | gold2``.
"""

from __future__ import annotations

import re
from typing import Any

from conductor.grading.extract import MAX_RESPONSE_CHARS, clip_tail, extract_math_answer
from conductor.grading.types import Sample, Verdict
from conductor.text import strip_think

__all__ = ["ShortAnswerGrader", "final_answer", "normalise_short"]

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
# Words and numbers; a decimal point or a sign inside a number is kept.
_TOKEN = re.compile(r"[+-]?\d+(?:\.\d+)?|[^\W_]+")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
# A reply this short, on one line and without an answer label, is taken as the answer.
_BARE_REPLY_CHARS = 60


def short_tokens(answer: str) -> list[str]:
    """The comparable words and numbers of a short answer: lower case, without
    punctuation, markup or articles."""
    value = answer.lower().replace("\\text{", " ")
    return _TOKEN.findall(_ARTICLES.sub(" ", value))


def normalise_short(answer: str) -> str:
    """The comparable form of a whole short answer (its tokens joined by spaces)."""
    return " ".join(short_tokens(answer))


def _same(left: list[str], right: list[str]) -> bool:
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if a != b and not (_NUMBER.fullmatch(a) and _NUMBER.fullmatch(b) and float(a) == float(b)):
            return False
    return True


def _golds(gold: object) -> list[list[str]]:
    items = gold if isinstance(gold, (list, tuple)) else str(gold or "").split("|")
    return [g for g in (short_tokens(str(item)) for item in items) if g]


def final_answer(text: str) -> str | None:
    """The reply's final answer as written, or ``None`` (see the module docstring)."""
    found = extract_math_answer(text)
    if found is not None:
        return found
    bare = strip_think(text).strip()
    return bare if bare and "\n" not in bare and len(bare) <= _BARE_REPLY_CHARS else None


class ShortAnswerGrader:
    """Normalised exact match of a short final answer (see the module docstring)."""

    name = "short"
    version = "1"

    def __init__(self, max_chars: int = MAX_RESPONSE_CHARS) -> None:
        if max_chars <= 0:
            raise ValueError("max_chars must be positive")
        self.max_chars = max_chars

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        """Extract the final answer from ``response`` and compare it with the gold."""
        golds = _golds(sample.gold)
        if not golds:
            return Verdict(
                "grader_error", f"the sample has no usable gold answer ({sample.gold!r})"
            )
        shown: object = " ".join(golds[0]) if len(golds) == 1 else [" ".join(g) for g in golds]
        detail: dict[str, Any] = {"gold": shown}
        extracted = final_answer(clip_tail(response, self.max_chars)) if response else None
        if extracted is None:
            return Verdict(
                "no_answer",
                "no answer could be read (no <answer> tag, \\boxed{} or ANSWER: line)",
                detail=detail,
            )
        tokens = short_tokens(extracted)
        for gold in golds:
            n = len(gold)
            for method, part in (("exact", tokens), ("first", tokens[:n]), ("last", tokens[-n:])):
                if _same(part, gold):
                    detail["method"] = method
                    how = {"exact": "is", "first": "begins with", "last": "ends with"}[method]
                    return Verdict(
                        "correct", f"{extracted!r} {how} the gold answer", extracted, detail
                    )
        return Verdict(
            "incorrect", f"{extracted!r} is not the gold answer {shown!r}", extracted, detail
        )
