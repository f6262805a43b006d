"""The multiple-choice grader, and the choice shuffling the dataset layer records.

The dataset layer shuffles each question's choices (:func:`shuffle_choices`,
deterministic per seed and sample id) and stores the correct letter *after* shuffling
as the sample's gold; this grader only reads the reply's letter and compares.

How the letter is read is the option ``extraction`` (:data:`EXTRACTIONS`): by default
``official``, lighteval's rules (:func:`~conductor.grading.extract.official_letter`),
so a GPQA or MMLU score means what the reference harness's does; ``conductor`` is this
project's stricter reader (:func:`~conductor.grading.extract.extract_letter`),
which never takes the "A" of "After" or of "A car" for an answer and reads
``\\boxed{\\text{B}}`` and ``<answer>B</answer>``.

Hedges are wrong, whichever reading (the rule every grader shares,
:func:`~conductor.grading.extract.hedge_in`): a reply whose stated answer names two or
more letters is not an answer, though the reader would take one of them.  The answer is
looked for where the reader found its letter (from an answer label or phrase to the end
of that line, or the whole line of a letter found without one) and wherever else the
reply states one (an ``ANSWER:`` label, "the answer is ...", every ``\\boxed{}``
together, an ``<answer>`` tag); in each, a letter counts when it stands alone or opens
an option's text: "A or B", "either A or C", "A/B", "A, B", "(A) and (C)", "A B C D",
"ABCD", "not sure: B or D", ``\\boxed{A} ... \\boxed{C}`` are wrong, while "the
answer is B (not A)", "B) 42 J", "D. I ruled out A and B." and "B because A is too
small" are read as before.  A later sentence counts only when it is short or opens with
"or", "maybe" and the like ("Answer: A. Or B.").
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence
from typing import Any

from conductor.grading.extract import (
    EXTRACTIONS,
    MAX_RESPONSE_CHARS,
    answer_places,
    check_extraction,
    clip_tail,
    hedge_in,
    letter_options,
    letter_reading,
)
from conductor.grading.types import Sample, Verdict

__all__ = ["EXTRACTIONS", "ChoiceGrader", "format_choices", "shuffle_choices"]

_LETTERS = string.ascii_uppercase


def shuffle_choices(
    choices: Sequence[str], correct_index: int, seed: int, sample_id: str
) -> tuple[list[str], str, list[int]]:
    """Shuffle ``choices`` the same way every time for this ``(seed, sample_id)``.

    Returns the shuffled choices, the letter of the correct one after shuffling, and the
    permutation: ``permutation[i]`` is the original index of the choice shown at
    position ``i`` (so it can be recorded and undone).
    """
    n = len(choices)
    if not 0 < n <= len(_LETTERS):
        raise ValueError(f"a question needs 1 to {len(_LETTERS)} choices, got {n}")
    if not 0 <= correct_index < n:
        raise ValueError(f"correct_index {correct_index} is out of range for {n} choices")
    permutation = list(range(n))
    # A private generator seeded by a string: stable across runs and Python versions,
    # and independent of every other sample's shuffle.
    random.Random(f"{seed}:{sample_id}").shuffle(permutation)
    shuffled = [choices[i] for i in permutation]
    return shuffled, _LETTERS[permutation.index(correct_index)], permutation


def format_choices(choices: Sequence[str]) -> str:
    """The choices as prompt lines: ``"A) ...\\nB) ..."``."""
    if len(choices) > len(_LETTERS):
        raise ValueError(f"at most {len(_LETTERS)} choices can be lettered, got {len(choices)}")
    return "\n".join(f"{_LETTERS[i]}) {str(choice).strip()}" for i, choice in enumerate(choices))


def _gold_letter(gold: object, n_choices: int) -> str | None:
    """The gold as a letter; an int gold is read as a 0-based index."""
    if isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return _LETTERS[gold] if 0 <= gold < min(n_choices, len(_LETTERS)) else None
    if isinstance(gold, str):
        letter = gold.strip().strip("()").upper()
        if len(letter) == 1 and letter in _LETTERS[:n_choices]:
            return letter
    return None


class ChoiceGrader:
    """Grades multiple-choice answers by letter.

    The sample's gold is the correct letter after shuffling; ``sample.input["choices"]``
    gives the number of choices, so only those letters are read from the reply.  A
    sample without choices is assumed to have four (A-D), or as many as its gold letter
    needs.
    """

    name = "choice"
    # 2: lighteval's letter rules by default (``extraction: official``).
    # 3: hedges ("A or B") are wrong.
    version = "3"

    def __init__(self, max_chars: int = MAX_RESPONSE_CHARS, extraction: str = "official") -> None:
        if max_chars <= 0:
            raise ValueError("max_chars must be positive")
        self.max_chars = max_chars
        self.extraction = check_extraction(extraction)

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        """Compare the reply's letter with the gold letter."""
        choices = sample.input.get("choices")
        if isinstance(choices, Sequence) and not isinstance(choices, str) and choices:
            n_choices = len(choices)
        else:
            n_choices = 4
            if isinstance(sample.gold, str) and sample.gold.strip().upper() in _LETTERS:
                n_choices = max(4, _LETTERS.index(sample.gold.strip().upper()) + 1)
        gold = _gold_letter(sample.gold, n_choices)
        if gold is None:
            return Verdict(
                "grader_error",
                f"the gold answer {sample.gold!r} is not one of the {n_choices} choice letters",
            )
        if not response:
            return Verdict("no_answer", "no answer letter could be read", detail={"gold": gold})
        truncated = len(response) > self.max_chars
        text = clip_tail(response, self.max_chars)
        letter, clause = letter_reading(text, n_choices, self.extraction)
        detail: dict[str, Any] = {"gold": gold, "n_choices": n_choices, "truncated": truncated}
        if letter is None:
            return Verdict("no_answer", "no answer letter could be read", detail=detail)
        places = [*answer_places(text), [clause or letter]]
        several = hedge_in(
            places, lambda part: letter_options(part, n_choices), first_sentence=True
        )
        if several is not None:
            detail["hedge"] = True
            named = ", ".join(str(key) for key in several)
            return Verdict(
                "incorrect",
                f"the answer names several letters ({named}): a hedge is not an answer",
                letter,
                detail,
            )
        if letter == gold:
            return Verdict("correct", f"answered {letter}, the correct letter", letter, detail)
        return Verdict(
            "incorrect", f"answered {letter}, the correct letter is {gold}", letter, detail
        )
