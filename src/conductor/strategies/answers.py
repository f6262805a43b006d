"""How a vote reads the answers it counts: the key each response is counted on."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["AnswerKey", "answer_key_for", "short_answer_key"]

#: Turns a response into the key that votes are counted on (``None`` = no answer).
AnswerKey = Callable[[str], "str | None"]


def short_answer_key(text: str) -> str | None:
    """What votes count for a question without a benchmark (``ask``, ``serve``): the
    short final answer each reply gives (``ANSWER: x``, a boxed answer, or a one-line
    reply), as ``short`` benchmarks read it."""
    return answer_key_for("short")(text)


def answer_key_for(grader: str) -> AnswerKey:
    """How votes are counted for a benchmark graded by ``grader``: the letter for
    multiple choice, a normalised final answer for math, the code text for code (exact
    matches only, so code votes rarely agree; a test-based vote is future work)."""
    if grader == "choice":
        from ..grading.extract import extract_letter

        return lambda text: extract_letter(text, 26)
    if grader == "math":
        from ..grading.extract import extract_math_answer
        from ..grading.math import normalise_answer

        def math_key(text: str) -> str | None:
            found = extract_math_answer(text)
            return normalise_answer(found) if found else None

        return math_key
    if grader == "short":
        from ..grading.short import final_answer, normalise_short

        def short_key(text: str) -> str | None:
            found = final_answer(text)
            return normalise_short(found) if found else None

        return short_key
    from ..grading.code_text import extract_code

    def code_key(text: str) -> str | None:
        code = extract_code(text)
        return code.strip() if code else None

    return code_key
