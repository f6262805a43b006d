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

Hedges are wrong (the rule every grader shares, :func:`~conductor.grading.extract.hedge_in`):
an answer that names two or more different options is not an answer, wherever the
reply states it (``ANSWER: yes or no``, ``\\boxed{yes} ... \\boxed{no}``, "yes/no",
"both yes and no", "yes, or maybe no").  What an option is depends on the gold:

* a yes/no gold (``yes``, ``no``, ``true``, ``false``): every yes or no word
  (``yeah``, ``nope`` ...; ``true`` = yes, ``false`` = no);
* a number: every number that is not an operand (``17 * 23 = 391`` names 391 alone;
  ``3-4`` and ``3 or 4`` name two);
* a single letter: every letter standing alone (not the pronoun "I");
* anything else: an alternative of at most one word more than the gold, in a sentence
  that offers alternatives ("or", "either", "both", "vs", a slash: "Paris or Rome";
  "Paris, France" is a place, not two).

For the first three kinds the gold must moreover be the only option the answer names,
so that the first/last rule cannot credit a word the answer denies or computes with
("yes, not no" is not right for "no", nor ``3 + 1 = 4`` for 3).  Words around a single
option keep it right: "yes, or at least most likely", "3, or equivalently 3.0",
"No, it is not Paris", and a restatement after a colon ("3 or 4 apples: 3").  A
bare reply "Yes, no doubt" names both yes and no, and is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator
from fractions import Fraction
from typing import Any

from conductor.grading.extract import (
    MAX_RESPONSE_CHARS,
    Part,
    Recognise,
    answer_places,
    clip_tail,
    extract_math_answer,
    hedge_in,
    named_options,
)
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


# --- what an option is, by the gold's kind (for the hedge rule) ----------------------

_YES_NO = {
    **dict.fromkeys(("yes", "yeah", "yep", "yup", "true"), "yes"),
    **dict.fromkeys(("no", "nope", "nah", "false"), "no"),
}
# A number (a sign only where no word or number precedes it: "5-3" is a difference) or
# a word with its apostrophes ("it's" is one word, so its "s" is no letter).
_SCAN = re.compile(r"(?<![\w.])[+-]?\d+(?:,\d{3})*(?:\.\d+)?(?!\d)|[^\W\d_]+(?:['’][^\W\d_]+)*")
_OPERATOR_SIGNS = "*×x·÷/+-−^"
_OPERATOR_WORDS = frozenset((
    "times", "plus", "minus", "divided", "over", "multiplied", "squared", "cubed", "mod",
    "modulo", "by",
))  # fmt: skip
# Marks a phrase gold's own spelling, whichever of its accepted forms matched.
_GOLD = ("gold",)


def _is_operand(text: str, tokens: list[re.Match[str]], index: int) -> bool:
    """Whether the number ``tokens[index]`` is computed with, not stated ("17" and
    "23" of ``17 * 23 = 391``; "3" and "4" of ``3-4``)."""
    token = tokens[index]
    before = text[tokens[index - 1].end() if index else 0 : token.start()].strip()
    after = text[token.end() : tokens[index + 1].start() if index + 1 < len(tokens) else len(text)]
    after = after.strip()
    if before[-1:] in _OPERATOR_SIGNS and before or after[:1] in _OPERATOR_SIGNS and after:
        return True
    neighbours = [
        tokens[i].group(0).lower() for i in (index - 1, index + 1) if 0 <= i < len(tokens)
    ]
    return any(word in _OPERATOR_WORDS for word in neighbours)


def _kind_tokens(text: str, kind: str) -> Iterator[Hashable]:
    """The options of ``kind`` ("yes_no", "number", "letter") named in ``text``."""
    tokens = list(_SCAN.finditer(text))
    for index, token in enumerate(tokens):
        word = token.group(0)
        if kind == "yes_no":
            key = _YES_NO.get(word.lower())
            if key is not None:
                yield key
        elif kind == "number":
            if word[-1].isdigit() and not _is_operand(text, tokens, index):
                yield Fraction(word.replace(",", ""))
        elif kind == "letter" and len(word) == 1 and word.isalpha():
            followed = index + 1 < len(tokens) and tokens[index + 1].group(0)[0].isalpha()
            # "I think" and "a dog" are a pronoun and an article, not letters.
            if not (followed and (word == "I" or word in "aA")):
                yield word.lower()


def _gold_kind(golds: list[list[str]]) -> str | None:
    """ "yes_no", "number" or "letter" when every gold is one option of that kind;
    ``None`` for words and phrases."""
    for kind in ("yes_no", "number", "letter"):
        if all(len(gold) == 1 and len(list(_kind_tokens(gold[0], kind))) == 1 for gold in golds):
            return kind
    return None


def _recogniser(golds: list[list[str]]) -> tuple[Recognise, set[Hashable], bool]:
    """``(what an option is for these golds, the golds' own keys, whether the kind is
    a closed one: yes/no, number or letter)``."""
    kind = _gold_kind(golds)
    if kind is not None:
        keys = {key for gold in golds for key in _kind_tokens(gold[0], kind)}
        return (lambda part: _kind_tokens(part.text, kind)), keys, True
    longest = max(len(gold) for gold in golds)

    def phrase(part: Part) -> list[Hashable]:
        if not part.alternative:
            return []
        tokens = short_tokens(part.text)
        if any(_same(tokens, gold) for gold in golds):
            return [_GOLD]
        return [tuple(tokens)] if 0 < len(tokens) <= longest + 1 else []

    return phrase, {_GOLD}, False


def _shown(options: dict[Hashable, str]) -> str:
    """The options for a verdict's reason: each key as a word, a phrase as written."""
    shown: list[str] = []
    for key, text in options.items():
        if isinstance(key, tuple) and key != _GOLD:
            text = " ".join(key)
        elif isinstance(key, (str, Fraction)):
            text = str(key)
        shown.append(repr(text))
    return ", ".join(shown)


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
    # 2: hedges ("yes or no") are wrong.
    version = "2"

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
                    refused = _hedged(response, extracted, golds)
                    if refused is not None:
                        detail["hedge"] = True
                        return Verdict("incorrect", refused, extracted, detail)
                    how = {"exact": "is", "first": "begins with", "last": "ends with"}[method]
                    return Verdict(
                        "correct", f"{extracted!r} {how} the gold answer", extracted, detail
                    )
        return Verdict(
            "incorrect", f"{extracted!r} is not the gold answer {shown!r}", extracted, detail
        )


def _hedged(response: str | None, extracted: str, golds: list[list[str]]) -> str | None:
    """Why an answer that matches the gold is still wrong (it names several options, or
    a different one than the gold), or ``None`` (see the module docstring).  An answer
    that is the gold exactly is checked too: the last of two boxes may be the gold."""
    recognise, gold_keys, closed = _recogniser(golds)
    several = hedge_in([*answer_places(response or ""), [extracted]], recognise)
    if several is not None:
        return f"the answer names several options ({_shown(several)}): a hedge is not an answer"
    named = named_options(extracted, recognise)
    if named.keys() <= gold_keys and (named or not closed):
        return None
    if named:
        return f"{extracted!r} names {_shown(named)}, not the gold answer"
    return f"{extracted!r} does not state the gold answer (it is denied or computed with)"
